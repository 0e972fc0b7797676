//! The registry in PostgreSQL (15 or later), for clusters whose operators keep
//! state in a database they already run: one table per kind of record, each
//! record the JSON the head wrote, in a `json` column that keeps it byte for
//! byte (`migrations/` has the schema; refinery applies it, numbered).
//!
//! One commit is one transaction, and it returns after PostgreSQL committed it
//! (with the server's default `synchronous_commit = on`, after its WAL is on
//! disk). A failed statement or a lost connection closes the store; reopening
//! connects again.
//!
//! rust-postgres's blocking client runs a runtime of its own, which must not be
//! entered, nor dropped, from a thread that is driving tokio tasks. The head
//! calls the registry from such threads, so every call here runs on a scoped
//! thread of its own ([`off_runtime`]): one thread start per call, small beside
//! a round trip to the database.

use std::sync::{Arc, Mutex, OnceLock};

use ::postgres::{Client, NoTls};
use tracing::{debug, warn};
use xp_runtime::ids::{ExperimentId, TrialId};
use xp_runtime::protocol::{AuditEntry, TelemetryWindow, TrialEvent, WorkerTelemetry};

use xp_head_core::auth::users::UserRecord;
use xp_head_core::{LoadedState, MetricRecord, Record};

use super::copy::{RawKey, RawRow, Table};
use super::{
    Changes, HistoryReader, HistoryReads, MetricsPage, RegistryError, Sequences, Store, by_rank,
    sample_stride,
};

mod follow;
mod raw;
mod rows;

mod embedded {
    refinery::embed_migrations!("migrations");
}

/// The oldest PostgreSQL the registry runs on (`server_version_num`).
const MIN_SERVER_VERSION: i32 = 150_000;

/// The advisory lock held while the schema is created or migrated, so two
/// heads starting on one database at once migrate it once ("xp-schema").
const MIGRATION_LOCK: i64 = 0x7870_2d73_6368_656d;

/// How long connecting may take before the head gives up (when the address
/// names no `connect_timeout` of its own).
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// Where the PostgreSQL registry is: a connection address (a `postgres://`
/// URL or `key=value` pairs) and the password, kept apart so that the address
/// can be shown and logged.
#[derive(Clone)]
pub struct PostgresTarget {
    config: ::postgres::Config,
    shown: String,
    /// TLS to the server, verified against the CA of `--store-ca-file`.
    tls: Option<Arc<rustls::ClientConfig>>,
}

impl std::fmt::Debug for PostgresTarget {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str(&self.shown)
    }
}

impl std::fmt::Display for PostgresTarget {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str(&self.shown)
    }
}

impl PostgresTarget {
    /// The database at `address`, logged in with `password` where given.
    /// An address that carries a password itself is refused: it would show in
    /// the process list and in logs.
    pub fn parse(address: &str, password: Option<&str>) -> Result<Self, RegistryError> {
        let mut config: ::postgres::Config = address.parse().map_err(|error| {
            RegistryError::PostgresSetup(format!("cannot read the address {address:?}: {error}"))
        })?;
        if config.get_password().is_some() {
            return Err(RegistryError::PostgresSetup(
                "the address carries a password: give it in a file (--store-password-file) or in XP_STORE_PASSWORD instead"
                    .to_owned(),
            ));
        }
        if let Some(password) = password {
            config.password(password);
        }
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECT_TIMEOUT);
        }
        if config.get_application_name().is_none() {
            config.application_name("xp-head");
        }
        Ok(Self {
            config,
            shown: address.to_owned(),
            tls: None,
        })
    }

    /// Talks TLS to the server, which must show a certificate for the
    /// address's host signed by a CA in `ca_file` (PEM); nothing goes in clear.
    pub fn with_ca_file(mut self, ca_file: &std::path::Path) -> Result<Self, RegistryError> {
        use rustls::pki_types::CertificateDer;
        use rustls::pki_types::pem::PemObject;
        let setup = |reason: String| RegistryError::PostgresSetup(reason);
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_file_iter(ca_file)
            .map_err(|error| setup(format!("cannot read {}: {error}", ca_file.display())))?
        {
            let cert = cert.map_err(|error| setup(format!("{}: {error}", ca_file.display())))?;
            roots
                .add(cert)
                .map_err(|error| setup(format!("{}: {error}", ca_file.display())))?;
        }
        if roots.is_empty() {
            return Err(setup(format!("{} holds no certificate", ca_file.display())));
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|error| setup(error.to_string()))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        self.config.ssl_mode(::postgres::config::SslMode::Require);
        self.tls = Some(Arc::new(tls));
        Ok(self)
    }

    /// Connects: over TLS when a CA was given, else in clear (refused where the
    /// address asks for TLS).
    pub(crate) fn connect(&self) -> Result<Client, RegistryError> {
        match &self.tls {
            Some(tls) => Ok(self
                .config
                .connect(tokio_postgres_rustls::MakeRustlsConnect::new((**tls).clone()))?),
            None if self.config.get_ssl_mode() == ::postgres::config::SslMode::Require => {
                Err(RegistryError::PostgresSetup(
                    "the address asks for sslmode=require: give the server's CA with --store-ca-file"
                        .to_owned(),
                ))
            }
            None => Ok(self.config.connect(NoTls)?),
        }
    }
}

/// Runs `work` where rust-postgres's blocking client may run: a thread that
/// drives no tokio tasks.
pub(crate) fn off_runtime<T: Send>(work: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|scope| {
        scope
            .spawn(work)
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

/// A connection to the registry's database, or none after a failure.
pub(crate) struct PostgresStore {
    target: PostgresTarget,
    client: Mutex<Option<Client>>,
    /// The leader's epoch and name every write checks, once this head leads.
    fence: Option<(i64, String)>,
    /// Whether this is a reader ([`Store::reader`]): it connects when first
    /// asked to read, and again after its connection was lost, instead of
    /// staying closed until the head reopens it.
    reconnects: bool,
    /// The reader of this store's history, connected when first used.
    reader: OnceLock<HistoryReader>,
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("PostgresStore")
            .field("target", &self.target)
            .field("open", &self.is_open())
            .finish()
    }
}

impl PostgresStore {
    /// Connects, checks the server, and creates or migrates the schema.
    pub(crate) fn open(target: &PostgresTarget) -> Result<Self, RegistryError> {
        let client = off_runtime(|| connect(target))?;
        Ok(Self {
            target: target.clone(),
            client: Mutex::new(Some(client)),
            fence: None,
            reconnects: false,
            reader: OnceLock::new(),
        })
    }

    /// A reader of `target`'s history, not connected yet.
    fn reader_of(target: &PostgresTarget) -> Self {
        Self {
            target: target.clone(),
            client: Mutex::new(None),
            fence: None,
            reconnects: true,
            reader: OnceLock::new(),
        }
    }

    /// Runs `work` with the connection, off the runtime.
    fn with_client<T: Send>(
        &self,
        work: impl FnOnce(&mut Client) -> Result<T, RegistryError> + Send,
    ) -> Result<T, RegistryError> {
        let mut client = self
            .client
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        if client.is_none() && self.reconnects {
            *client = Some(off_runtime(|| self.target.connect())?);
        }
        let connection = client.as_mut().ok_or(RegistryError::Closed)?;
        let result = off_runtime(|| work(connection));
        // A reader's failed read may have left its connection broken:
        // the next one connects again.
        if self.reconnects && (result.is_err() || connection.is_closed()) {
            let lost = client.take();
            off_runtime(move || drop(lost));
        }
        result
    }
}

impl PostgresStore {
    /// Writes `rows` and the next numbers `next` in one transaction, fenced.
    fn commit(&self, rows: &rows::Rows, next: Sequences) -> Result<(), RegistryError> {
        let fence = self.fence.as_ref();
        self.with_client(|client| {
            let mut txn = client.transaction()?;
            check_fence(&mut txn, fence)?;
            rows.write(&mut txn, next)?;
            txn.commit()?;
            Ok(())
        })
    }
}

impl Drop for PostgresStore {
    fn drop(&mut self) {
        self.close();
    }
}

/// Connects to `target`, checks its version and encoding, and migrates it.
fn connect(target: &PostgresTarget) -> Result<Client, RegistryError> {
    let mut client = target.connect()?;
    let version: i32 = client
        .query_one("SELECT current_setting('server_version_num')::int", &[])?
        .get(0);
    if version < MIN_SERVER_VERSION {
        return Err(RegistryError::PostgresSetup(format!(
            "{target} runs PostgreSQL {}.{}: the registry needs 15 or later",
            version / 10_000,
            version % 10_000
        )));
    }
    let encoding: String = client
        .query_one("SELECT current_setting('server_encoding')", &[])?
        .get(0);
    if encoding != "UTF8" {
        return Err(RegistryError::PostgresSetup(format!(
            "{target} has encoding {encoding}: the registry needs a UTF8 database (createdb -E UTF8)"
        )));
    }
    // A head paused inside a transaction (SIGSTOP) must not hold the lead row
    // past its lease: PostgreSQL ends such a session after this long.
    client.batch_execute("SET idle_in_transaction_session_timeout = '5s'")?;
    client.execute("SELECT pg_advisory_lock($1)", &[&MIGRATION_LOCK])?;
    let migrated = embedded::migrations::runner().run(&mut client);
    client.execute("SELECT pg_advisory_unlock($1)", &[&MIGRATION_LOCK])?;
    let report = migrated?;
    for migration in report.applied_migrations() {
        tracing::info!(%target, migration = %migration, "registry schema migrated");
    }
    Ok(client)
}

/// An event's experiment id as the head wrote it (its JSON), the key of the
/// index `events_by_experiment` (`migrations/V5__events_by_experiment_and_trial.sql`:
/// the same expression, or the index is not used).
const EXPERIMENT_OF_EVENT: &str = r#"substring(record::text FROM '^\{"seq":\d+,"at":\d+,"trial":\{"experiment":(\{"digest":\d+,"run":\d+\})')"#;
/// An event's trial id as the head wrote it, the key of `events_by_trial`.
const TRIAL_OF_EVENT: &str = r#"substring(record::text FROM '^\{"seq":\d+,"at":\d+,"trial":(\{"experiment":\{"digest":\d+,"run":\d+\},"index":\d+\})')"#;

/// `id` as the head writes it in a record: the key of an index above.
fn json_key(kind: &'static str, id: &impl serde::Serialize) -> Result<String, RegistryError> {
    serde_json::to_string(id).map_err(|source| RegistryError::Encode { kind, source })
}

impl HistoryReads for PostgresStore {
    fn events_after(
        &self,
        experiment: ExperimentId,
        after: u64,
        limit: usize,
    ) -> Result<Vec<TrialEvent>, RegistryError> {
        // Stored numbers fit an i64; a start past them finds nothing.
        let Ok(after) = i64::try_from(after) else {
            return Ok(Vec::new());
        };
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let key = json_key("experiment id", &experiment)?;
        self.with_client(|client| {
            let rows = client.query(
                &format!("SELECT record::text FROM events WHERE {EXPERIMENT_OF_EVENT} = $1 AND seq > $2 ORDER BY seq LIMIT $3"),
                &[&key, &after, &limit],
            )?;
            Ok(rows::decode(&rows, "event"))
        })
    }

    fn newest_events_of_trial(
        &self,
        trial: TrialId,
        limit: usize,
    ) -> Result<Vec<TrialEvent>, RegistryError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let key = json_key("trial id", &trial)?;
        self.with_client(|client| {
            let rows = client.query(
                &format!("SELECT record::text FROM events WHERE {TRIAL_OF_EVENT} = $1 ORDER BY seq DESC LIMIT $2"),
                &[&key, &limit],
            )?;
            Ok(rows::decode(&rows, "event"))
        })
    }

    fn audit(&self, limit: usize) -> Result<Vec<AuditEntry>, RegistryError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.with_client(|client| {
            let rows = client.query(
                "SELECT record::text FROM (SELECT seq, record FROM audit ORDER BY seq DESC LIMIT $1) AS newest ORDER BY seq",
                &[&limit],
            )?;
            Ok(rows::decode(&rows, "audit entry"))
        })
    }

    fn metrics_page(
        &self,
        trial: TrialId,
        after: Option<u64>,
        limit: usize,
        max_bytes: usize,
    ) -> Result<MetricsPage, RegistryError> {
        let trial = trial.to_string();
        self.with_client(|client| rows::metrics_page(client, &trial, after, limit, max_bytes))
    }

    fn metric_samples(
        &self,
        trial: TrialId,
        max_records: usize,
    ) -> Result<Vec<MetricRecord>, RegistryError> {
        let trial = trial.to_string();
        self.with_client(|client| {
            let total: i64 = client
                .query_one("SELECT count(*) FROM metrics WHERE trial = $1", &[&trial])?
                .get(0);
            let stride = sample_stride(usize::try_from(total).unwrap_or(0), max_records);
            let stride = i64::try_from(stride).unwrap_or(i64::MAX);
            let rows = client.query(
                "SELECT record::text FROM (SELECT record, row_number() OVER (ORDER BY seq) - 1 AS position FROM metrics WHERE trial = $1) AS numbered WHERE position % $2::bigint = 0 OR position = $3::bigint - 1 ORDER BY position",
                &[&trial, &stride, &total],
            )?;
            Ok(rows::decode(&rows, "metric"))
        })
    }

    fn telemetry_of(&self, trial: TrialId) -> Result<Vec<WorkerTelemetry>, RegistryError> {
        let trial = trial.to_string();
        self.with_client(|client| {
            let rows = client.query(
                "SELECT rank, record::text FROM telemetry WHERE trial = $1 ORDER BY rank, slot",
                &[&trial],
            )?;
            let windows = rows.iter().filter_map(|row| {
                let rank = u32::try_from(row.get::<_, i64>(0)).ok()?;
                let window = rows::decode_one::<TelemetryWindow>(row, 1, "telemetry window")?;
                Some((rank, window))
            });
            Ok(by_rank(windows))
        })
    }
}

impl Store for PostgresStore {
    fn sequences(&self) -> Result<Sequences, RegistryError> {
        self.with_client(|client| {
            let mut next = Sequences {
                metric: 1,
                audit: 1,
            };
            for row in client.query("SELECT key, value FROM xp_meta", &[])? {
                let value = u64::try_from(row.get::<_, i64>(1)).unwrap_or(1);
                match row.get::<_, &str>(0) {
                    "next_metric_seq" => next.metric = value,
                    "next_audit_seq" => next.audit = value,
                    _ => {}
                }
            }
            Ok(next)
        })
    }

    fn write(&mut self, records: &[Record], next: Sequences) -> Result<Sequences, RegistryError> {
        let (rows, after) = rows::Rows::encode(records, next)?;
        self.commit(&rows, after)?;
        Ok(after)
    }

    fn read_all(&self) -> Result<LoadedState, RegistryError> {
        self.with_client(rows::read_all)
    }

    fn changes(&self, after: i64) -> Result<Option<Changes>, RegistryError> {
        self.with_client(|client| follow::changes(client, after).map(Some))
    }

    fn export(
        &self,
        table: Table,
        after: Option<&RawKey>,
        limit: usize,
    ) -> Result<Vec<RawRow>, RegistryError> {
        self.with_client(|client| raw::export(client, table, after, limit))
    }

    fn import(
        &mut self,
        table: Table,
        rows: &[RawRow],
        next: Sequences,
    ) -> Result<(), RegistryError> {
        self.commit(&rows::Rows::from_raw(table, rows)?, next)
    }

    fn users(&self) -> Result<Vec<UserRecord>, RegistryError> {
        self.with_client(|client| {
            let rows = client.query("SELECT record::text FROM users ORDER BY name", &[])?;
            Ok(rows::decode(&rows, "user"))
        })
    }

    fn metrics_of(&self, trial: TrialId) -> Result<Vec<MetricRecord>, RegistryError> {
        let trial = trial.to_string();
        self.with_client(|client| {
            let rows = client.query(
                "SELECT record::text FROM metrics WHERE trial = $1 ORDER BY seq",
                &[&trial],
            )?;
            Ok(rows::decode(&rows, "metric"))
        })
    }

    fn telemetry_series(
        &self,
        trial: TrialId,
        rank: u32,
    ) -> Result<Vec<TelemetryWindow>, RegistryError> {
        let trial = trial.to_string();
        self.with_client(|client| {
            let rows = client.query(
                "SELECT record::text FROM telemetry WHERE trial = $1 AND rank = $2 ORDER BY slot",
                &[&trial, &i64::from(rank)],
            )?;
            Ok(rows::decode(&rows, "telemetry window"))
        })
    }

    fn fence(&mut self, epoch: i64, holder: &str) {
        self.fence = Some((epoch, holder.to_owned()));
    }

    fn reader(&self) -> Result<HistoryReader, RegistryError> {
        let reader = self
            .reader
            .get_or_init(|| Arc::new(Self::reader_of(&self.target)));
        Ok(Arc::clone(reader))
    }

    fn is_open(&self) -> bool {
        self.client
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
            .is_some()
    }

    fn close(&mut self) {
        let client = self
            .client
            .get_mut()
            .unwrap_or_else(|poison| poison.into_inner())
            .take();
        if client.is_some() {
            debug!(target = %self.target, "closing the registry's database connection");
            // Dropping the client stops its runtime: off the caller's.
            off_runtime(move || drop(client));
        }
    }

    fn reopen(&mut self) -> Result<(), RegistryError> {
        self.close();
        let client = off_runtime(|| connect(&self.target))?;
        *self
            .client
            .get_mut()
            .unwrap_or_else(|poison| poison.into_inner()) = Some(client);
        Ok(())
    }
}

/// Checks, first in a write's transaction, that the store is still led by the
/// fence's holder in its epoch. The row is locked FOR SHARE: a takeover waits
/// for this transaction, and once it committed, this check fails.
fn check_fence(
    txn: &mut ::postgres::Transaction<'_>,
    fence: Option<&(i64, String)>,
) -> Result<(), RegistryError> {
    let Some((epoch, holder)) = fence else {
        return Ok(());
    };
    let leads = txn.query_opt(
        "SELECT 1 FROM xp_leader WHERE id = 1 AND epoch = $1 AND holder = $2 FOR SHARE",
        &[epoch, holder],
    )?;
    match leads {
        Some(_) => Ok(()),
        None => Err(RegistryError::Fenced { epoch: *epoch }),
    }
}

/// Logs a record that cannot be read back (a later version's, or damaged).
fn unreadable(kind: &str, error: &serde_json::Error) {
    warn!(kind, %error, "unreadable record skipped");
}
