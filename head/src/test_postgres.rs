//! A real PostgreSQL server for tests: a cluster made with `initdb` in a
//! temporary directory, serving on a Unix socket there only (no TCP port to
//! collide on), stopped and removed on drop. Where the process is root, the
//! server runs as the `postgres` user (or `nobody`): PostgreSQL refuses root.
//!
//! For the head's own tests and the workspace's end-to-end tests; not part of
//! the head's interface.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running throw-away PostgreSQL server.
#[derive(Debug)]
pub struct TestPostgres {
    dir: tempfile::TempDir,
    bin: PathBuf,
    server: Option<Child>,
    owner: Option<(u32, u32)>,
    durable: bool,
    /// With TLS: the loopback TCP port it serves TLS on, besides its socket.
    tls_port: Option<u16>,
}

/// Where PostgreSQL's server programs are: on `PATH`, or where Debian's
/// `postgresql` package puts them (`/usr/lib/postgresql/VERSION/bin`).
fn find_bin() -> Option<PathBuf> {
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|path| std::env::split_paths(&path).collect::<Vec<_>>());
    let mut debian: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| entry.path().join("bin"))
        .collect();
    // The newest version first: "15" < "16" sorts right for two-digit versions.
    debian.sort();
    debian.reverse();
    on_path.chain(debian).find(|dir| {
        ["initdb", "postgres", "pg_isready"]
            .iter()
            .all(|program| dir.join(program).is_file())
    })
}

/// The user the server runs as: none (this user) unless this process is root.
fn server_owner() -> Option<(u32, u32)> {
    if !nix::unistd::geteuid().is_root() {
        return None;
    }
    let user = nix::unistd::User::from_name("postgres")
        .ok()
        .flatten()
        .or_else(|| nix::unistd::User::from_name("nobody").ok().flatten())?;
    Some((user.uid.as_raw(), user.gid.as_raw()))
}

impl TestPostgres {
    /// Starts one, or says why it cannot (no PostgreSQL installed, initdb failed).
    /// `durable` keeps `fsync` on (for measurements); tests turn it off.
    pub fn start(durable: bool) -> Result<Self, String> {
        let this = Self::init(durable)?;
        this.launched()
    }

    /// Makes the cluster with `initdb`, not yet started.
    fn init(durable: bool) -> Result<Self, String> {
        let bin = find_bin().ok_or(
            "PostgreSQL's initdb and postgres are not installed (Debian: apt-get install postgresql)",
        )?;
        let dir = tempfile::Builder::new()
            .prefix("xp-postgres-")
            .tempdir()
            .map_err(|error| format!("a temporary directory: {error}"))?;
        let owner = server_owner();
        if let Some((uid, gid)) = owner {
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid))
                .map_err(|error| format!("chown {}: {error}", dir.path().display()))?;
        }
        let this = Self {
            dir,
            bin,
            server: None,
            owner,
            durable,
            tls_port: None,
        };
        let data = this.data_dir();
        this.run(
            "initdb",
            &[
                "-D",
                &data,
                "-U",
                "xp",
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
            ],
        )?;
        Ok(this)
    }

    /// Starts the server and waits until it takes connections.
    fn launched(mut self) -> Result<Self, String> {
        self.launch()?;
        Ok(self)
    }

    /// Starts one that also serves TLS on a loopback TCP port, with a
    /// certificate for `localhost` signed by a CA of its own ([`Self::ca_file`]).
    pub fn start_tls() -> Result<Self, String> {
        let mut this = Self::init(false)?;
        this.write_certificates()
            .map_err(|error| format!("TLS certificates: {error}"))?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .map_err(|error| format!("a free port: {error}"))?
            .port();
        this.tls_port = Some(port);
        this.launched()
    }

    /// Writes a CA (`ca.pem`) and the server's certificate and key, readable
    /// by the server's user only.
    fn write_certificates(&self) -> Result<(), Box<dyn std::error::Error>> {
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new())?;
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca = rcgen::CertifiedIssuer::self_signed(ca_params, rcgen::KeyPair::generate()?)?;
        let key = rcgen::KeyPair::generate()?;
        let cert =
            rcgen::CertificateParams::new(vec!["localhost".to_owned()])?.signed_by(&key, &ca)?;
        let dir = self.dir.path();
        std::fs::write(dir.join("ca.pem"), ca.pem())?;
        std::fs::write(dir.join("server.crt"), cert.pem())?;
        xp_runtime::tls::write_private_file(
            &dir.join("server.key"),
            key.serialize_pem().as_bytes(),
        )?;
        if let Some((uid, gid)) = self.owner {
            for name in ["server.crt", "server.key"] {
                std::os::unix::fs::chown(dir.join(name), Some(uid), Some(gid))?;
            }
        }
        Ok(())
    }

    /// The CA that signed a TLS server's certificate (PEM).
    pub fn ca_file(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// The address of a TLS server's database over TCP, asking for TLS.
    pub fn tls_address(&self) -> Option<String> {
        let port = self.tls_port?;
        Some(format!(
            "host=localhost port={port} user=xp dbname=postgres sslmode=require"
        ))
    }

    fn data_dir(&self) -> String {
        self.dir.path().join("data").display().to_string()
    }

    /// The directory of the server's socket (its `host`).
    pub fn socket_dir(&self) -> &Path {
        self.dir.path()
    }

    /// The connection address (`key=value` pairs) of the database `initdb`
    /// made, `postgres`, as its superuser `xp`.
    pub fn address(&self) -> String {
        format!(
            "host={} port={} user=xp dbname=postgres",
            self.socket_dir().display(),
            self.port()
        )
    }

    /// A `postgres://` address of the same database.
    pub fn url(&self) -> String {
        self.url_of("postgres")
    }

    /// The port its socket is named for.
    fn port(&self) -> u16 {
        self.tls_port.unwrap_or(5432)
    }

    fn url_of(&self, database: &str) -> String {
        let host: String = url::form_urlencoded::byte_serialize(
            self.socket_dir().display().to_string().as_bytes(),
        )
        .collect();
        format!("postgres://xp@{host}:{}/{database}", self.port())
    }

    /// Creates an empty database `name` (letters, digits and `_`); its
    /// `postgres://` address.
    pub fn create_database(&self, name: &str) -> Result<String, String> {
        let socket = self.socket_dir().display().to_string();
        let output = Command::new(self.bin.join("createdb"))
            .args(["-h", &socket, "-U", "xp", "-E", "UTF8", name])
            .output()
            .map_err(|error| format!("createdb: {error}"))?;
        if !output.status.success() {
            return Err(format!(
                "createdb {name} failed: {}",
                String::from_utf8_lossy(&output.stderr)
            ));
        }
        Ok(self.url_of(name))
    }

    fn command(&self, program: &str) -> Command {
        let mut command = Command::new(self.bin.join(program));
        if let Some((uid, gid)) = self.owner {
            use std::os::unix::process::CommandExt;
            command.uid(uid).gid(gid);
        }
        command
    }

    fn run(&self, program: &str, args: &[&str]) -> Result<(), String> {
        let output = self
            .command(program)
            .args(args)
            .output()
            .map_err(|error| format!("{program}: {error}"))?;
        if !output.status.success() {
            return Err(format!(
                "{program} failed: {}",
                String::from_utf8_lossy(&output.stderr)
            ));
        }
        Ok(())
    }

    /// Starts the server on the cluster and waits until it takes connections.
    #[expect(
        clippy::disallowed_methods,
        reason = "a test harness, outside any runtime, waits for a server process it started"
    )]
    fn launch(&mut self) -> Result<(), String> {
        let socket = self.socket_dir().display().to_string();
        let fsync = if self.durable {
            "fsync=on"
        } else {
            "fsync=off"
        };
        let log = std::fs::File::create(self.dir.path().join("server.log"))
            .map_err(|error| format!("the server log: {error}"))?;
        let mut command = self.command("postgres");
        command.args(["-D", &self.data_dir(), "-k", &socket]);
        match self.tls_port {
            Some(port) => {
                let dir = self.dir.path().display().to_string();
                command
                    .args(["-p", &port.to_string(), "-c", "listen_addresses=127.0.0.1"])
                    .args([
                        "-c",
                        "ssl=on",
                        "-c",
                        &format!("ssl_cert_file={dir}/server.crt"),
                    ])
                    .args(["-c", &format!("ssl_key_file={dir}/server.key")]);
            }
            None => {
                command.args(["-c", "listen_addresses="]);
            }
        }
        let child = command
            .args(["-c", fsync, "-c", "max_connections=40"])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|error| format!("postgres: {error}"))?;
        self.server = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self.accepts_connections() {
            if Instant::now() > deadline {
                return Err(format!("postgres did not start: {}", self.log()));
            }
            if let Some(Ok(Some(status))) = self.server.as_mut().map(Child::try_wait) {
                return Err(format!("postgres exited with {status}: {}", self.log()));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    /// Whether the server takes connections (`pg_isready`).
    fn accepts_connections(&self) -> bool {
        Command::new(self.bin.join("pg_isready"))
            .arg("-h")
            .arg(self.socket_dir())
            .args(["-p", &self.port().to_string()])
            .args(["-U", "xp", "-d", "postgres", "-q"])
            .status()
            .is_ok_and(|status| status.success())
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }

    /// Stops the server (a fast shutdown: open sessions are ended), keeping its data.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.server.take() {
            let pid = nix::unistd::Pid::from_raw(child.id() as i32);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT);
            let _ = child.wait();
            let socket = format!(".s.PGSQL.{}", self.port());
            let _ = std::fs::remove_file(self.socket_dir().join(socket));
        }
    }

    /// Starts the stopped server again on the same data.
    pub fn restart(&mut self) -> Result<(), String> {
        self.stop();
        self.launch()
    }
}

impl Drop for TestPostgres {
    fn drop(&mut self) {
        self.stop();
    }
}
