-- The head's registry in PostgreSQL: one table per kind of record, each record
-- as the JSON the head wrote (a `json` column keeps it byte for byte, so it
-- reads back exactly and SQL can query it with -> and ->>), beside its key.
-- docs/postgres.md documents the tables for analysts. Text keys compare byte
-- by byte (COLLATE "C"), as in the embedded store, so both list records in one
-- order and `xp-head store copy` can compare them.

-- The next numbers of numbered records: next_metric_seq, next_audit_seq.
CREATE TABLE xp_meta (key text COLLATE "C" PRIMARY KEY, value bigint NOT NULL);

CREATE TABLE experiments (id text COLLATE "C" PRIMARY KEY, record json NOT NULL);
CREATE TABLE trials (id text COLLATE "C" PRIMARY KEY, record json NOT NULL);
CREATE TABLE nodes (id text COLLATE "C" PRIMARY KEY, record json NOT NULL);
-- Trial events (state changes), by the head's event number.
CREATE TABLE events (seq bigint PRIMARY KEY, record json NOT NULL);
-- Metric reports by trial and arrival number, so one trial's history is a range scan.
CREATE TABLE metrics (
    trial text COLLATE "C" NOT NULL,
    seq bigint NOT NULL,
    record json NOT NULL,
    PRIMARY KEY (trial, seq)
);
-- The scheduling policy in force, under the name `current`.
CREATE TABLE policy (name text COLLATE "C" PRIMARY KEY, record json NOT NULL);
CREATE TABLE users (name text COLLATE "C" PRIMARY KEY, record json NOT NULL);
CREATE TABLE audit (seq bigint PRIMARY KEY, record json NOT NULL);
-- Telemetry windows by trial, rank and slot (a ring of windows per worker).
CREATE TABLE telemetry (
    trial text COLLATE "C" NOT NULL,
    rank bigint NOT NULL,
    slot bigint NOT NULL,
    record json NOT NULL,
    PRIMARY KEY (trial, rank, slot)
);
CREATE TABLE pipelines (id bigint PRIMARY KEY, record json NOT NULL);
CREATE TABLE alerts (id bigint PRIMARY KEY, record json NOT NULL);
