//! Code and data versions, computed where the files are: on the submitting machine.
//!
//! The code version is the git commit of a work tree plus a hash of any
//! uncommitted change (tracked diffs and untracked files); the data version hashes
//! the declared files. Both feed the experiment's content hash.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Why a version could not be computed.
#[derive(Debug, thiserror::Error)]
pub enum VersionError {
    /// `git` could not be started.
    #[error("cannot read the code version of {path}: cannot run git")]
    GitSpawn {
        /// The code directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// `git` failed on the code directory.
    #[error("cannot read the code version of {path}: {reason}")]
    Git {
        /// The code directory.
        path: PathBuf,
        /// What git said.
        reason: String,
    },
    /// A data path could not be read.
    #[error("cannot hash data path {path}: {source}")]
    Data {
        /// The path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

fn git(dir: &Path, args: &[&str]) -> Result<Vec<u8>, VersionError> {
    let output = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .map_err(|source| VersionError::GitSpawn {
            path: dir.to_owned(),
            source,
        })?;
    if !output.status.success() {
        return Err(VersionError::Git {
            path: dir.to_owned(),
            reason: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        });
    }
    Ok(output.stdout)
}

/// `git:COMMIT`, or `git:COMMIT+dirty:HASH` when the work tree has uncommitted changes.
pub fn code_version(dir: &Path) -> Result<String, VersionError> {
    let commit = String::from_utf8_lossy(&git(dir, &["rev-parse", "HEAD"])?)
        .trim()
        .to_owned();
    let diff = git(dir, &["diff", "HEAD", "--binary"])?;
    let untracked = git(dir, &["ls-files", "--others", "--exclude-standard", "-z"])?;
    if diff.is_empty() && untracked.is_empty() {
        return Ok(format!("git:{commit}"));
    }
    let mut hasher = blake3::Hasher::new();
    hasher.update(&diff);
    let top = String::from_utf8_lossy(&git(dir, &["rev-parse", "--show-toplevel"])?)
        .trim()
        .to_owned();
    for name in untracked
        .split(|byte| *byte == 0)
        .filter(|name| !name.is_empty())
    {
        let relative = String::from_utf8_lossy(name).into_owned();
        hasher.update(relative.as_bytes());
        let contents = std::fs::read(Path::new(&top).join(&relative)).map_err(|source| {
            VersionError::Data {
                path: PathBuf::from(&relative),
                source,
            }
        })?;
        hasher.update(&(contents.len() as u64).to_le_bytes());
        hasher.update(&contents);
    }
    Ok(format!(
        "git:{commit}+dirty:{}",
        &hasher.finalize().to_hex()[..16]
    ))
}

/// `none` for no paths, else `blake3:HASH` over every file's path (as declared,
/// so the version does not depend on where the files sit) and bytes. Declared
/// paths are resolved against `base`.
pub fn data_version(base: &Path, declared: &[String]) -> Result<String, VersionError> {
    if declared.is_empty() {
        return Ok("none".to_owned());
    }
    let mut hasher = blake3::Hasher::new();
    for name in declared {
        let root = base.join(name);
        let mut files = Vec::new();
        collect_files(&root, &mut files)?;
        files.sort();
        for file in files {
            let relative = file
                .strip_prefix(&root)
                .unwrap_or(&file)
                .to_string_lossy()
                .into_owned();
            hasher.update(name.as_bytes());
            hasher.update(relative.as_bytes());
            let mut reader = std::fs::File::open(&file).map_err(|source| VersionError::Data {
                path: file.clone(),
                source,
            })?;
            let len =
                std::io::copy(&mut reader, &mut hasher).map_err(|source| VersionError::Data {
                    path: file.clone(),
                    source,
                })?;
            hasher.update(&len.to_le_bytes());
        }
    }
    Ok(format!("blake3:{}", &hasher.finalize().to_hex()[..32]))
}

fn collect_files(path: &Path, out: &mut Vec<PathBuf>) -> Result<(), VersionError> {
    let metadata = std::fs::metadata(path).map_err(|source| VersionError::Data {
        path: path.to_owned(),
        source,
    })?;
    if metadata.is_file() {
        out.push(path.to_owned());
        return Ok(());
    }
    for entry in std::fs::read_dir(path).map_err(|source| VersionError::Data {
        path: path.to_owned(),
        source,
    })? {
        let entry = entry.map_err(|source| VersionError::Data {
            path: path.to_owned(),
            source,
        })?;
        collect_files(&entry.path(), out)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_version_follows_content() {
        let base = std::env::temp_dir().join(format!("xp-data-version-{}", std::process::id()));
        let dir = base.join("data");
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        std::fs::write(dir.join("a.txt"), "one").unwrap();
        std::fs::write(dir.join("sub/b.txt"), "two").unwrap();
        let declared = ["data".to_owned()];
        let first = data_version(&base, &declared).unwrap();
        assert_eq!(first, data_version(&base, &declared).unwrap());
        std::fs::write(dir.join("sub/b.txt"), "three").unwrap();
        assert_ne!(first, data_version(&base, &declared).unwrap());
        assert_eq!(data_version(&base, &[]).unwrap(), "none");
        assert!(data_version(&base, &["missing".to_owned()]).is_err());
        std::fs::remove_dir_all(&base).unwrap();
    }
}
