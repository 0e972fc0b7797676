-- Standby heads: the one row of xp_leader says which head leads the store, in
-- which epoch, and until when (PostgreSQL's clock). A head takes the lead only
-- once the lease ran out, bumping the epoch; every write of the registry first
-- checks that the row still names its writer's epoch (FOR SHARE, so a takeover
-- waits for a commit in flight and every later commit of the old leader fails).
CREATE TABLE xp_leader (
    id integer PRIMARY KEY CHECK (id = 1),
    epoch bigint NOT NULL,
    holder text NOT NULL,
    address text NOT NULL,
    expires_at timestamptz NOT NULL
);

-- The cluster's trust material (its CA, keys and token), written by the first
-- head and read by the others, so heads share one identity without copying files.
CREATE TABLE xp_cluster_files (
    name text COLLATE "C" PRIMARY KEY,
    bytes bytea NOT NULL
);
