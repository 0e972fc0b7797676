//! A pipeline stage's inputs: the files of upstream stages a launch carries
//! (`Launch::inputs`), put into the worker's `XP_INPUT_DIR` before it starts.
//!
//! Each object comes from this node's store or a verified copy fetched from a
//! node that holds it (as a checkpoint being resumed does), and each directory
//! is written from the verified bytes as the node's files, which a worker
//! running under a user id of its own can read but not change (files 0444,
//! directories 0555). The launch's argv carries a marker per directory
//! (`spec::input_marker`), which [`replace_markers`] swaps for its absolute path.
//!
//! Not here: deciding which files a stage gets (the head does).
//!
//! Invariants: every input file is written from bytes that hashed to its id,
//! under a name that is a plain relative path; nothing is created, written or
//! chmodded by path below the work directory (a worker may have put links there).

use std::collections::BTreeMap;
use std::io::Write;
use std::os::fd::OwnedFd;
use std::path::{Component, Path, PathBuf};

use xp_runtime::protocol::{CheckpointFile, Launch};

use super::restore::CheckpointSources;
use crate::isolation::INPUT_DIR;
use crate::isolation::fs as lane_fs;
use crate::objects::remote::Wanted;
use crate::objects::{ObjectBytes, ObjectChange, Owner};

impl CheckpointSources {
    /// Fills `work_dir/inputs/NAME` (by descriptor, [`write_input_dir`]; the
    /// node made `inputs` with the work directory) for each input of `launch`; returns the
    /// worker's `XP_INPUT_DIR` and each marker with its directory, or why an
    /// input could not be had (the trial's attempt fails with it).
    pub(crate) async fn fill_inputs(
        &self,
        launch: &Launch,
        work_dir: &Path,
    ) -> Result<Vec<(String, PathBuf)>, String> {
        let mut filled = Vec::with_capacity(launch.inputs.len());
        if launch.inputs.is_empty() {
            return Ok(filled);
        }
        let root = work_dir.join(INPUT_DIR);
        for input in &launch.inputs {
            if !xp_runtime::protocol::is_safe_checkpoint_name(&input.name)
                || input.name.contains('/')
            {
                return Err(format!("input name {:?} is not a plain name", input.name));
            }
            let mut contents = Vec::with_capacity(input.files.len());
            for file in &input.files {
                let bytes = self
                    .fetcher
                    .ensure(
                        &self.store,
                        Wanted {
                            id: file.object,
                            owner: Owner::Trial(launch.key.trial),
                            pin: false,
                            size: Some(file.size),
                            path: launch.object_path,
                        },
                        &input.sources,
                        Some(self.own_node),
                    )
                    .await
                    .map_err(|error| {
                        format!(
                            "cannot fetch {} of input {}: {}",
                            file.name,
                            input.name,
                            xp_runtime::error_chain::error_chain(&error)
                        )
                    })?;
                let _ = self.changes.send(ObjectChange::Added(file.object));
                contents.push(bytes);
            }
            let dir = root.join(&input.name);
            let (files, work, name) =
                (input.files.clone(), work_dir.to_owned(), input.name.clone());
            tokio::task::spawn_blocking(move || write_input_dir(&work, &name, &files, &contents))
                .await
                .map_err(|error| error.to_string())?
                .map_err(|error| format!("cannot write input {}: {error}", input.name))?;
            filled.push((input.marker.clone(), dir));
        }
        Ok(filled)
    }
}

/// Writes input directory `name` (new) under `work_dir/inputs` from verified
/// `contents`, as the node's read-only files (0444) and directories (0555).
///
/// Everything is done by descriptor (`isolation::fs`): ranks of one attempt
/// share a user id and are prepared concurrently, so another rank may be
/// swapping directories in this rank's work directory for links while this
/// runs. `inputs` is opened without following a link, every directory is made
/// from its parent's descriptor, every file created with `O_EXCL|O_NOFOLLOW`,
/// and modes are set with `fchmod` on the descriptors the node opened; nothing
/// is walked or changed by path, so nothing outside can be written or chmodded.
pub(crate) fn write_input_dir(
    work_dir: &Path,
    name: &str,
    files: &[CheckpointFile],
    contents: &[ObjectBytes],
) -> std::io::Result<()> {
    let invalid = |why: String| std::io::Error::new(std::io::ErrorKind::InvalidInput, why);
    if !xp_runtime::protocol::is_safe_checkpoint_name(name) || name.contains('/') {
        return Err(invalid(format!("input name {name:?} is not a plain name")));
    }
    // The rank directory's parent is the node's: the rank directory itself
    // cannot be swapped, only what is inside it.
    let rank = lane_fs::open_dir(work_dir)?;
    let root = lane_fs::open_dir_in(&rank, INPUT_DIR.as_ref())?;
    if lane_fs::exists_in(&root, name.as_ref()) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::AlreadyExists,
            format!("input directory {name} is already there"),
        ));
    }
    let top = lane_fs::make_dir_in(&root, name.as_ref(), 0o755, None)?;
    // Every directory made, to be made read-only once all files are in.
    let mut made: BTreeMap<PathBuf, OwnedFd> = BTreeMap::new();
    for (file, bytes) in files.iter().zip(contents) {
        if !xp_runtime::protocol::is_safe_checkpoint_name(&file.name) {
            return Err(invalid(format!(
                "input file name {:?} is not a plain relative path",
                file.name
            )));
        }
        let relative = Path::new(&file.name);
        let mut dir = top.try_clone()?;
        let mut walked = PathBuf::new();
        for component in relative.parent().unwrap_or(Path::new("")).components() {
            let Component::Normal(part) = component else {
                return Err(invalid(format!(
                    "{} is not a plain relative path",
                    file.name
                )));
            };
            walked.push(part);
            dir = match made.get(&walked) {
                Some(open) => open.try_clone()?,
                None => {
                    let open = lane_fs::make_dir_in(&dir, part, 0o755, None)?;
                    made.insert(walked.clone(), open.try_clone()?);
                    open
                }
            };
        }
        let leaf = relative.file_name().unwrap_or_default();
        let mut out = lane_fs::create_file_in(&dir, leaf, 0o444, None)?;
        out.write_all(&bytes[..])?;
    }
    for dir in made.values().chain(std::iter::once(&top)) {
        nix::sys::stat::fchmod(dir, nix::sys::stat::Mode::from_bits_truncate(0o555))
            .map_err(std::io::Error::from)?;
    }
    Ok(())
}

/// `arg` with each marker replaced by its directory.
pub(crate) fn replace_markers(arg: &str, filled: &[(String, PathBuf)]) -> String {
    let mut out = arg.to_owned();
    for (marker, dir) in filled {
        if out.contains(marker.as_str()) {
            out = out.replace(marker.as_str(), &dir.display().to_string());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;
    use std::path::PathBuf;

    use xp_runtime::protocol::CheckpointFile;

    use super::{INPUT_DIR, replace_markers, write_input_dir};
    use crate::objects::ObjectBytes;

    fn one_file(name: &str, bytes: &[u8]) -> (Vec<CheckpointFile>, Vec<ObjectBytes>) {
        let file = CheckpointFile {
            name: name.to_owned(),
            object: xp_runtime::ids::ObjectId::of(bytes),
            size: bytes.len() as u64,
        };
        (vec![file], vec![ObjectBytes::shared(bytes.into())])
    }

    fn mode(path: &std::path::Path) -> u32 {
        std::fs::symlink_metadata(path)
            .expect("metadata")
            .permissions()
            .mode()
            & 0o777
    }

    #[test]
    fn inputs_are_written_read_only_by_descriptor() {
        let temp = tempfile::tempdir().expect("tempdir");
        let work = temp.path().join("rank0");
        std::fs::create_dir_all(work.join(INPUT_DIR)).expect("inputs");
        let (files, contents) = one_file("sub/n.txt", b"42");
        write_input_dir(&work, "prep.outputs", &files, &contents).expect("write");
        let dir = work.join(INPUT_DIR).join("prep.outputs");
        assert_eq!(std::fs::read(dir.join("sub/n.txt")).expect("read"), b"42");
        assert_eq!(mode(&dir.join("sub/n.txt")), 0o444);
        assert_eq!(mode(&dir.join("sub")), 0o555);
        assert_eq!(mode(&dir), 0o555);
    }

    #[test]
    fn links_planted_in_place_of_input_directories_are_not_followed() {
        let temp = tempfile::tempdir().expect("tempdir");
        let outside = temp.path().join("outside");
        std::fs::create_dir(&outside).expect("outside");
        std::fs::write(outside.join("secret"), b"root's").expect("secret");
        std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o750)).expect("chmod");
        std::fs::set_permissions(
            outside.join("secret"),
            std::fs::Permissions::from_mode(0o640),
        )
        .expect("chmod");
        let (files, contents) = one_file("secret", b"worker's");
        // The input directory itself is a link.
        let work = temp.path().join("rank0");
        std::fs::create_dir_all(work.join(INPUT_DIR)).expect("inputs");
        std::os::unix::fs::symlink(&outside, work.join(INPUT_DIR).join("prep.outputs"))
            .expect("symlink");
        assert!(write_input_dir(&work, "prep.outputs", &files, &contents).is_err());
        // Its parent, `inputs`, is a link.
        let work = temp.path().join("rank1");
        std::fs::create_dir_all(&work).expect("work");
        std::os::unix::fs::symlink(&outside, work.join(INPUT_DIR)).expect("symlink");
        assert!(write_input_dir(&work, "prep.outputs", &files, &contents).is_err());
        assert!(!outside.join("prep.outputs").exists());
        // Nothing outside was written or chmodded.
        assert_eq!(
            std::fs::read(outside.join("secret")).expect("read"),
            b"root's"
        );
        assert_eq!(mode(&outside), 0o750);
        assert_eq!(mode(&outside.join("secret")), 0o640);
    }

    #[test]
    fn markers_become_directories_and_other_text_stays() {
        let filled = vec![(
            "{xp-input:prep.outputs:5f0c}".to_owned(),
            PathBuf::from("/data/work/t/a1/rank0/inputs/prep.outputs"),
        )];
        assert_eq!(
            replace_markers(
                "n=$(cat {xp-input:prep.outputs:5f0c}/n.txt) {xp-input:prep.outputs}",
                &filled
            ),
            "n=$(cat /data/work/t/a1/rank0/inputs/prep.outputs/n.txt) {xp-input:prep.outputs}"
        );
        assert_eq!(replace_markers("plain", &filled), "plain");
    }
}
