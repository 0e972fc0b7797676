-- Warm standbys: every row of the tables a head loads carries the number of
-- the change that wrote it last, from one sequence. The leader is the one
-- writer and commits one transaction at a time, so a standby that has read
-- every row up to change N reads what changed since with `change > N`, and
-- keeps its copy of the registry current without reading it all again.
-- (Rows already stored get numbers here, in no particular order.)
CREATE SEQUENCE xp_change;

ALTER TABLE experiments ADD COLUMN change bigint NOT NULL DEFAULT nextval('xp_change');
ALTER TABLE trials ADD COLUMN change bigint NOT NULL DEFAULT nextval('xp_change');
ALTER TABLE nodes ADD COLUMN change bigint NOT NULL DEFAULT nextval('xp_change');
ALTER TABLE events ADD COLUMN change bigint NOT NULL DEFAULT nextval('xp_change');
ALTER TABLE policy ADD COLUMN change bigint NOT NULL DEFAULT nextval('xp_change');
ALTER TABLE pipelines ADD COLUMN change bigint NOT NULL DEFAULT nextval('xp_change');
ALTER TABLE alerts ADD COLUMN change bigint NOT NULL DEFAULT nextval('xp_change');

CREATE INDEX experiments_by_change ON experiments (change);
CREATE INDEX trials_by_change ON trials (change);
CREATE INDEX nodes_by_change ON nodes (change);
CREATE INDEX events_by_change ON events (change);
CREATE INDEX policy_by_change ON policy (change);
CREATE INDEX pipelines_by_change ON pipelines (change);
CREATE INDEX alerts_by_change ON alerts (change);
