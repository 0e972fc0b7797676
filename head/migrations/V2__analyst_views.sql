-- Views for analysts: the documented way to query xp's record with SQL, a
-- notebook or a BI tool without going through the head (docs/postgres.md).
-- They read the tables the head writes; later versions keep their columns.

-- One row per experiment, with the parts of its spec people filter on.
CREATE VIEW xp_experiments AS
SELECT e.id AS experiment,
       s.spec ->> 'name' AS name,
       s.spec ->> 'team' AS team,
       s.spec -> 'search' ->> 'metric' AS metric,
       coalesce(s.spec -> 'search' ->> 'mode', 'min') AS mode,
       to_timestamp((e.record ->> 'submitted_at')::bigint / 1000.0) AS submitted_at,
       (e.record ->> 'cancelled')::boolean AS cancelled,
       e.record ->> 'code_version' AS code_version,
       e.record ->> 'data_version' AS data_version,
       s.spec
FROM experiments AS e
CROSS JOIN LATERAL (SELECT (e.record ->> 'spec_json')::json AS spec) AS s;

-- One row per trial: its configuration, state and last metric values (rank 0's;
-- a value that is not finite is the string NaN, Infinity or -Infinity).
CREATE VIEW xp_trials AS
SELECT t.id AS trial,
       split_part(t.id, '-t', 1) AS experiment,
       lower(t.record ->> 'state') AS state,
       (t.record ->> 'config_json')::json AS config,
       t.record -> 'metrics' AS metrics,
       (t.record ->> 'last_step')::bigint AS last_step,
       json_array_length(t.record -> 'attempts') AS attempts,
       (t.record ->> 'preemptions')::integer AS preemptions,
       to_timestamp((t.record ->> 'created_at')::bigint / 1000.0) AS created_at,
       to_timestamp((t.record ->> 'finished_at')::bigint / 1000.0) AS finished_at
FROM trials AS t;

-- One row per attempt, with the GPUs it held (each worker's GPUs times its
-- share of each) and GPU-hours from placement to its end (to now while it runs),
-- as the dashboard counts them.
CREATE VIEW xp_attempts AS
SELECT t.id AS trial,
       split_part(t.id, '-t', 1) AS experiment,
       (a.attempt ->> 'number')::integer AS attempt,
       a.attempt ->> 'outcome' AS outcome,
       to_timestamp((a.attempt ->> 'placed_at')::bigint / 1000.0) AS placed_at,
       to_timestamp((a.attempt ->> 'running_at')::bigint / 1000.0) AS running_at,
       to_timestamp((a.attempt ->> 'ended_at')::bigint / 1000.0) AS ended_at,
       g.gpus,
       g.gpus * extract(epoch FROM
           coalesce(to_timestamp((a.attempt ->> 'ended_at')::bigint / 1000.0), now())
           - to_timestamp((a.attempt ->> 'placed_at')::bigint / 1000.0)) / 3600.0 AS gpu_hours
FROM trials AS t
CROSS JOIN LATERAL json_array_elements(t.record -> 'attempts') AS a(attempt)
CROSS JOIN LATERAL (
    SELECT coalesce(sum(json_array_length(w -> 'gpu_indices')
                        * coalesce((w ->> 'gpu_milli')::numeric, 1000) / 1000), 0) AS gpus
    FROM json_array_elements(a.attempt -> 'workers') AS w
) AS g;

-- One row per reported value: a metric report holds several.
CREATE VIEW xp_metrics AS
SELECT m.trial,
       split_part(m.trial, '-t', 1) AS experiment,
       m.seq,
       (m.record -> 'key' ->> 'attempt')::integer AS attempt,
       (m.record -> 'key' ->> 'rank')::integer AS rank,
       (m.record ->> 'step')::bigint AS step,
       to_timestamp((m.record ->> 'at')::bigint / 1000.0) AS at,
       v.key AS metric,
       (v.value #>> '{}')::double precision AS value
FROM metrics AS m
CROSS JOIN LATERAL json_each(m.record -> 'values') AS v;
