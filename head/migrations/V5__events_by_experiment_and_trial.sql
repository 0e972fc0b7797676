-- Events by experiment and by trial, each in event order: the head keeps no
-- events in memory, and reads an experiment's (the event feed) or a trial's
-- newest (its detail) through these. The keys are the event's trial and its
-- experiment as the head wrote them, taken from the record's text rather than
-- by parsing it as JSON: PostgreSQL refuses to parse a record whose reason
-- holds an escaped NUL character, and the head writes every event's fields in
-- one order (seq, at, trial, ...), which anchors the pattern.
CREATE INDEX events_by_experiment ON events (
    (substring(record::text FROM '^\{"seq":\d+,"at":\d+,"trial":\{"experiment":(\{"digest":\d+,"run":\d+\})')),
    seq
);
CREATE INDEX events_by_trial ON events (
    (substring(record::text FROM '^\{"seq":\d+,"at":\d+,"trial":(\{"experiment":\{"digest":\d+,"run":\d+\},"index":\d+\})')),
    seq
);
