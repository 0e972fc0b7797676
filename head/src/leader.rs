//! Standby heads on one PostgreSQL store: which head leads, and the trust
//! material they share.
//!
//! The lead is a lease in the store's `xp_leader` row, judged by PostgreSQL's
//! clock: a head takes it only once it ran out ([`LEASE`] after its holder's
//! last renewal), and taking it bumps the epoch. The leader renews it every
//! [`RENEW_EVERY`]; every commit of the registry checks the row still names its
//! epoch (`registry::postgres`), so a leader paused past its lease can never
//! write after another took over. A leader that finds another head leading
//! steps down: it stops serving, so nodes and clients go to the new leader.
//! One that cannot reach the store keeps trying: its writes are refused
//! meanwhile (the fence needs the store), and it leads on if no other head
//! took over by the time the store answers again.

use std::sync::Arc;
use std::time::Duration;

use ::postgres::Client;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::registry::{PostgresTarget, Registry, RegistryError, off_runtime};

/// How long a lead lasts without renewal.
pub(crate) const LEASE: Duration = Duration::from_secs(5);
/// How often the leader renews it.
const RENEW_EVERY: Duration = Duration::from_secs(1);
/// How often a standby tries to take it.
const POLL_EVERY: Duration = Duration::from_millis(250);
/// How often a standby reads what its leader stored.
const FOLLOW_EVERY: Duration = Duration::from_secs(1);

/// This head's lead of the store.
#[derive(Debug, Clone)]
pub(crate) struct Leadership {
    target: PostgresTarget,
    /// This head's name in the lease (unique per start).
    pub(crate) holder: String,
    /// The epoch it leads in.
    pub(crate) epoch: i64,
}

/// A connection for the lease alone, so renewals never queue behind commits.
fn lease_client(target: &PostgresTarget) -> Result<Client, RegistryError> {
    target.connect()
}

/// The lease's connection, made when first needed and again after a failure.
/// rust-postgres's client must not be dropped on a thread driving tokio
/// tasks, so it is dropped off the runtime.
struct LeaseConnection(Option<Client>);

impl LeaseConnection {
    /// Runs `work` with the connection (connecting first if needed), off the
    /// runtime; a failure drops the connection, to connect again next time.
    fn run<T: Send>(
        &mut self,
        target: &PostgresTarget,
        work: impl FnOnce(&mut Client) -> Result<T, RegistryError> + Send,
    ) -> Result<T, RegistryError> {
        let slot = &mut self.0;
        off_runtime(move || {
            let client = match slot {
                Some(client) => client,
                None => slot.insert(lease_client(target)?),
            };
            let outcome = work(client);
            if outcome.is_err() {
                *slot = None;
            }
            outcome
        })
    }
}

impl Drop for LeaseConnection {
    fn drop(&mut self) {
        if let Some(client) = self.0.take() {
            off_runtime(move || drop(client));
        }
    }
}

/// Takes the lead if it ran out: the new epoch, or `None` (with who leads).
fn try_take(
    client: &mut Client,
    holder: &str,
    address: &str,
) -> Result<Result<i64, (i64, String)>, RegistryError> {
    let lease = LEASE.as_millis() as i64;
    let taken = client.query_opt(
        "INSERT INTO xp_leader (id, epoch, holder, address, expires_at) \
         VALUES (1, 1, $1, $2, now() + $3::bigint * interval '1 millisecond') \
         ON CONFLICT (id) DO UPDATE SET epoch = xp_leader.epoch + 1, holder = EXCLUDED.holder, \
             address = EXCLUDED.address, expires_at = EXCLUDED.expires_at \
         WHERE xp_leader.expires_at < now() \
         RETURNING epoch",
        &[&holder, &address, &lease],
    )?;
    if let Some(row) = taken {
        return Ok(Ok(row.get(0)));
    }
    let row = client.query_one("SELECT epoch, address FROM xp_leader WHERE id = 1", &[])?;
    Ok(Err((row.get(0), row.get(1))))
}

/// Waits until this head leads the store (at once when no head does), trying
/// again while the store cannot be reached; its lead. `address` is where it
/// will serve, for the standbys' logs.
pub(crate) async fn lead(target: &PostgresTarget, address: &str) -> Leadership {
    #[expect(
        clippy::disallowed_methods,
        reason = "a head's name in the lease is minted here, once per start"
    )]
    let holder = format!("{}@{address}", uuid::Uuid::new_v4());
    let mut connection = LeaseConnection(None);
    let (mut announced, mut unreachable) = (false, false);
    loop {
        let attempt = connection.run(target, |client| try_take(client, &holder, address));
        let was_unreachable = std::mem::replace(&mut unreachable, attempt.is_err());
        match attempt {
            Ok(Ok(epoch)) => {
                info!(epoch, %holder, "this head leads the store");
                return Leadership {
                    target: target.clone(),
                    holder,
                    epoch,
                };
            }
            Ok(Err((epoch, leader))) if !announced => {
                info!(epoch, %leader, "standing by: another head leads the store; taking over when its lease runs out");
                announced = true;
            }
            Ok(Err(_)) => {}
            Err(error) if !was_unreachable => {
                warn!(%error, "cannot reach the store to take the lead; trying again until it answers");
            }
            Err(_) => {}
        }
        tokio::time::sleep(POLL_EVERY).await;
    }
}

/// Waits until this head leads the store, as [`lead`] does, keeping
/// `registry`'s copy of the store current meanwhile (every [`FOLLOW_EVERY`]),
/// so that taking over reads only the last changes, not the whole store.
pub(crate) async fn lead_warm(
    target: &PostgresTarget,
    address: &str,
    registry: &mut Registry,
) -> Leadership {
    let leading = lead(target, address);
    tokio::pin!(leading);
    let mut follow = tokio::time::interval(FOLLOW_EVERY);
    follow.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let (mut warm, mut unreachable) = (false, false);
    loop {
        tokio::select! {
            biased;
            leadership = &mut leading => return leadership,
            _ = follow.tick() => {}
        }
        let started = tokio::time::Instant::now();
        match registry.follow() {
            Ok(_) => {
                unreachable = false;
                if !std::mem::replace(&mut warm, true) {
                    let (experiments, trials) = registry.committed_counts();
                    info!(
                        experiments,
                        trials,
                        took_ms = started.elapsed().as_millis() as u64,
                        "standing by warm: following the store"
                    );
                }
            }
            Err(error) => {
                if !std::mem::replace(&mut unreachable, true) {
                    warn!(%error, "cannot follow the store; trying again");
                }
            }
        }
    }
}

impl Leadership {
    /// Renews the lease; `false` when another head holds it now.
    fn renew(&self, client: &mut Client) -> Result<bool, RegistryError> {
        let lease = LEASE.as_millis() as i64;
        let renewed = client.query_opt(
            "UPDATE xp_leader SET expires_at = now() + $3::bigint * interval '1 millisecond' \
             WHERE id = 1 AND epoch = $1 AND holder = $2 RETURNING 1",
            &[&self.epoch, &self.holder, &lease],
        )?;
        Ok(renewed.is_some())
    }

    /// Keeps the lead until `shutdown`: renews it, and steps down (cancels
    /// `shutdown` and sets `stepped_down`) once the store says another head
    /// leads.
    pub(crate) async fn keep(
        self,
        shutdown: CancellationToken,
        stepped_down: Arc<std::sync::atomic::AtomicBool>,
    ) {
        let mut connection = LeaseConnection(None);
        let mut unreachable = false;
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                () = tokio::time::sleep(RENEW_EVERY) => {}
            }
            let renewed = connection.run(&self.target, |client| self.renew(client));
            match renewed {
                Ok(true) => {
                    if std::mem::take(&mut unreachable) {
                        info!(
                            epoch = self.epoch,
                            "the store answers again: this head still leads"
                        );
                    }
                    continue;
                }
                Ok(false) => {}
                Err(error) => {
                    if !std::mem::replace(&mut unreachable, true) {
                        warn!(%error, "cannot renew the lead: trying again until the store answers");
                    }
                    continue;
                }
            }
            error!(
                epoch = self.epoch,
                "stepping down: the store refused this head's lease renewal, another head leads it now"
            );
            stepped_down.store(true, std::sync::atomic::Ordering::SeqCst);
            shutdown.cancel();
            return;
        }
        self.release(&mut connection);
    }

    /// Gives the lead up at a clean shutdown, so a standby takes over at once.
    fn release(&self, connection: &mut LeaseConnection) {
        let released = connection.run(&self.target, |client| {
            client.execute(
                "UPDATE xp_leader SET expires_at = now() WHERE id = 1 AND epoch = $1 AND holder = $2",
                &[&self.epoch, &self.holder],
            )?;
            Ok(())
        });
        if let Err(error) = released {
            warn!(%error, "cannot give the lead up; a standby takes over when the lease runs out");
        }
    }
}

/// The advisory lock heads take while they share the trust material, so two
/// first starts at once make one identity ("xp-ident").
const IDENTITY_LOCK: i64 = 0x7870_2d69_6465_6e74;

/// Makes `tls_dir` hold the cluster's trust material as the store keeps it:
/// written there from the store when the store has it (a file already there
/// that differs is refused: that directory belongs to another cluster), else
/// made by `create_local` and uploaded (the first head's).
pub(crate) fn share_identity(
    target: &PostgresTarget,
    tls_dir: &std::path::Path,
    create_local: impl FnOnce() -> Result<(), String> + Send,
) -> Result<(), String> {
    let names = xp_runtime::tls::ClusterIdentity::FILES;
    off_runtime(|| {
        let mut client = lease_client(target).map_err(|error| error.to_string())?;
        // Held until the connection closes, at the end of this call.
        client
            .execute("SELECT pg_advisory_lock($1)", &[&IDENTITY_LOCK])
            .map_err(|error| crate::registry::postgres_detail(&error))?;
        let stored = |client: &mut Client| -> Result<Vec<(String, Vec<u8>)>, String> {
            let rows = client
                .query(
                    "SELECT name, bytes FROM xp_cluster_files ORDER BY name",
                    &[],
                )
                .map_err(|error| crate::registry::postgres_detail(&error))?;
            Ok(rows.iter().map(|row| (row.get(0), row.get(1))).collect())
        };
        let mut files = stored(&mut client)?;
        if files.is_empty() {
            create_local()?;
            for name in names {
                let bytes = std::fs::read(tls_dir.join(name))
                    .map_err(|error| format!("{}: {error}", tls_dir.join(name).display()))?;
                client
                    .execute(
                        "INSERT INTO xp_cluster_files (name, bytes) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING",
                        &[&name, &bytes],
                    )
                    .map_err(|error| crate::registry::postgres_detail(&error))?;
            }
            files = stored(&mut client)?;
        }
        xp_runtime::tls::create_private_dir(tls_dir)
            .map_err(|error| format!("{}: {error}", tls_dir.display()))?;
        for (name, bytes) in &files {
            if !names.contains(&name.as_str()) {
                return Err(format!("the store holds an unknown cluster file {name:?}"));
            }
            let path = tls_dir.join(name);
            match std::fs::read(&path) {
                Ok(local) if &local == bytes => {}
                Ok(_) => {
                    return Err(format!(
                        "{} differs from the cluster identity the store holds: this data directory belongs to another cluster",
                        path.display()
                    ));
                }
                Err(_) => xp_runtime::tls::write_private_file(&path, bytes)
                    .map_err(|error| format!("{}: {error}", path.display()))?,
            }
        }
        Ok(())
    })
}
