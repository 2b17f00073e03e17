-- leased-outbox schema, version 9 (stored in the table outbox_schema).
-- Applied once by Outbox.open() inside one BEGIN IMMEDIATE transaction.

-- One row per event. `identity` is the event's global identity, UUID text
-- (UUIDv7 unless the caller supplied one), what recipients dedupe on; the id
-- is local to this file, and is never reused all the same, even after
-- purge() deleted the highest ids, so logs, fences and explain() never
-- confuse two events: an enqueue picks an id above both the highest id and
-- outbox_id_floor below. Versions 1 to 8 declared the id AUTOINCREMENT,
-- which writes the table sqlite_sequence at every insert, one more page per
-- commit; a file made by one of them keeps that declaration (SQLite cannot
-- drop it without rebuilding the table), and works the same.
-- Version 4 added `identity`, last, so an upgraded table matches a new one; it
-- may be NULL only because ALTER TABLE cannot add a NOT NULL column without a
-- default: enqueue always writes it, the upgrade fills it, and the trigger
-- outbox_events_fill_identity below fills it for rows other writers insert. `due_at` is when
-- the event can next be claimed: the end of its delay while pending, its lease
-- deadline while leased (SQS's visibility timeout), so one index serves both
-- "pending and due" and "lease lapsed" claims. `claimed_at` is when the latest
-- claim was made (version 3 added it, last for the same reason); an
-- acknowledgement keeps `token` and `lease_until` (see
-- outbox_unwritten_attempts). The CHECKs list values with OR, not IN: SQLite
-- builds an IN list's lookup table again for every row it writes, which cost
-- a claim or an acknowledgement 0.8 µs in WASM (versions 1 and 2 used IN; an
-- upgrade keeps their constraints as they were).
CREATE TABLE outbox_events (
  id INTEGER PRIMARY KEY,
  queue TEXT NOT NULL,
  state TEXT NOT NULL CHECK (
    state = 'pending' OR state = 'leased' OR state = 'done' OR state = 'dead'
  ),
  payload ANY,
  dedup_key TEXT,
  ordering_key TEXT,
  due_at INTEGER NOT NULL,
  lease_until INTEGER,
  token TEXT,
  fence INTEGER NOT NULL DEFAULT 0,
  attempt INTEGER NOT NULL DEFAULT 0,
  max_attempts INTEGER NOT NULL CHECK (max_attempts >= 1),
  last_error TEXT,
  created_at INTEGER NOT NULL,
  updated_at INTEGER NOT NULL,
  done_at INTEGER,
  claimed_at INTEGER,
  identity TEXT,
  priority INTEGER NOT NULL DEFAULT 0,
  concurrency_key TEXT
) STRICT;

-- Identities are unique across queues: a supplied identity that exists
-- already deduplicates the enqueue, as a dedup key does.
CREATE UNIQUE INDEX outbox_events_identity ON outbox_events (identity);

-- Matches the claim query exactly (queue =, state IN, due_at <=, ORDER BY
-- priority DESC, due_at, id): done and dead rows are not in it, so they cost
-- claims nothing. Version 7 put priority first (events keep 0 unless given
-- one, so a queue without priorities walks it as version 6's (queue,
-- due_at, id)); a claim passes over the not yet due events of higher
-- priorities.
CREATE INDEX outbox_events_claim ON outbox_events (queue, priority DESC, due_at, id)
  WHERE state IN ('pending', 'leased');

-- The live leases of each concurrency key, which a claim under a per-key
-- limit counts (version 7 added it).
CREATE INDEX outbox_events_concurrency ON outbox_events (queue, concurrency_key, due_at)
  WHERE state = 'leased' AND concurrency_key IS NOT NULL;

-- Leases on an event's last attempt: once lapsed they are dead letters.
CREATE INDEX outbox_events_last_attempt ON outbox_events (due_at)
  WHERE state = 'leased' AND attempt >= max_attempts;

-- Rows inserted without an identity (the sqlite3 shell, the application's
-- own SQL) get a UUIDv7 stamped with their created_at, 74 random bits from
-- randomblob(), as Outbox.open()'s upgrade to version 4 gives old rows: an
-- event is never handed out without one (version 5 added it).
CREATE TRIGGER outbox_events_fill_identity AFTER INSERT ON outbox_events
  WHEN NEW.identity IS NULL
BEGIN
  UPDATE outbox_events SET identity = (
    SELECT substr(t, 1, 8) || '-' || substr(t, 9, 4) || '-7' || substr(r, 1, 3)
      || '-' || substr('89ab89ab89ab89ab', instr('0123456789abcdef', substr(r, 4, 1)), 1)
      || substr(r, 5, 3) || '-' || substr(r, 8, 12)
    FROM (SELECT printf('%012x', NEW.created_at & 0xffffffffffff) AS t,
      lower(hex(randomblob(10))) AS r))
  WHERE id = NEW.id;
END;

-- The highest event id ever deleted (version 9 added it): one row, written
-- only when a delete reaches above it (purge(), or the application's own
-- SQL), by the trigger outbox_events_deleted; an enqueue's id is above it,
-- so an id is never reused. A row inserted with an id at or below it (the
-- sqlite3 shell's INSERT without an id, once the highest ids were deleted,
-- takes the highest remaining id plus one) is refused by the trigger
-- outbox_events_id_reused rather than reuse the id of a deleted event.
CREATE TABLE outbox_id_floor (
  seq INTEGER NOT NULL
) STRICT;

INSERT INTO outbox_id_floor (seq) VALUES (0);

CREATE TRIGGER outbox_events_deleted AFTER DELETE ON outbox_events
  WHEN OLD.id > (SELECT seq FROM outbox_id_floor)
BEGIN
  UPDATE outbox_id_floor SET seq = OLD.id;
END;

CREATE TRIGGER outbox_events_id_reused AFTER INSERT ON outbox_events
  WHEN NEW.id <= (SELECT seq FROM outbox_id_floor)
BEGIN
  SELECT RAISE(ABORT, 'outbox_events: this id belonged to a deleted event; insert with an id above outbox_id_floor.seq');
END;

-- Idempotent enqueue: the key stays after the event is done.
CREATE UNIQUE INDEX outbox_events_dedup ON outbox_events (queue, dedup_key)
  WHERE dedup_key IS NOT NULL;

-- Per-key FIFO: finds an earlier unfinished event with the same ordering key.
CREATE INDEX outbox_events_ordering ON outbox_events (queue, ordering_key, id)
  WHERE state IN ('pending', 'leased') AND ordering_key IS NOT NULL;

-- The live leases of each ordering key, which hold back every other event of
-- their key, an earlier one a redrive or retry made pending included: one
-- event of a key in flight at a time, as on PostgreSQL (version 8 added it).
CREATE INDEX outbox_events_ordering_leased ON outbox_events (queue, ordering_key, due_at)
  WHERE state = 'leased' AND ordering_key IS NOT NULL;

-- Counts per queue and state, and each state's oldest event, without
-- reading the table: queues() and the dashboard's overview (version 6 added
-- it).
CREATE INDEX outbox_events_state ON outbox_events (queue, state, created_at);

-- Retention: purge() deletes done rows by completion time.
CREATE INDEX outbox_events_done ON outbox_events (done_at)
  WHERE state = 'done';

-- The written part of the attempt ledger: rows for claims, renewals,
-- releases, acknowledgements, stale calls, lease expiries, dead letters and
-- retries, less each event's latest claim and acknowledgement while they are
-- unwritten (outbox_ledger below is the whole ledger). lease.ts writes it,
-- one statement per batch (version 1 used triggers, which cost one trigger
-- program per row and doubled the cost of a batch; Outbox.open() drops them
-- when it upgrades a version 1 database).
CREATE TABLE outbox_attempts (
  id INTEGER PRIMARY KEY,
  event_id INTEGER NOT NULL,
  fence INTEGER NOT NULL,
  kind TEXT NOT NULL CHECK (
    kind = 'claimed' OR kind = 'renewed' OR kind = 'released'
    OR kind = 'acknowledged' OR kind = 'stale_acknowledge'
    OR kind = 'stale_renew' OR kind = 'stale_release' OR kind = 'expired'
    OR kind = 'dead' OR kind = 'retried'
  ),
  at INTEGER NOT NULL,
  token TEXT,
  lease_until INTEGER,
  detail TEXT
) STRICT;

CREATE INDEX outbox_attempts_event ON outbox_attempts (event_id, id);

-- The ledger by time: the dashboard's chart counts failed attempts per
-- minute (version 6 added it). Claims and acknowledgements mostly stay
-- unwritten, so it costs a claim+ack cycle nothing.
CREATE INDEX outbox_attempts_at ON outbox_attempts (at);

-- Flow control per queue (version 7 added it; core/flow.ts): a row only
-- while something is set. `tokens` and `refilled_at` are the rate limit's
-- token bucket, judged by the outbox's clock.
CREATE TABLE outbox_queues (
  queue TEXT PRIMARY KEY,
  paused INTEGER NOT NULL DEFAULT 0,
  per_key INTEGER,
  per_second INTEGER,
  tokens REAL,
  refilled_at INTEGER,
  updated_at INTEGER NOT NULL
) STRICT;

-- Cron schedules (version 7 added it; core/schedules.ts): `next_at` is the
-- next tick to enqueue, `options` the events' enqueue options as JSON.
CREATE TABLE outbox_schedules (
  name TEXT PRIMARY KEY,
  cron TEXT NOT NULL,
  timezone TEXT,
  queue TEXT NOT NULL,
  payload ANY,
  options TEXT NOT NULL,
  missed TEXT NOT NULL,
  next_at INTEGER NOT NULL,
  last_at INTEGER,
  updated_at INTEGER NOT NULL
) STRICT;

-- The entries of an event's latest claim that its row still holds. Most
-- events are claimed once and acknowledged, and writing those two entries
-- as rows cost a batch a third of its time, so lease.ts leaves them in the row
-- (claimed_at, token, lease_until as the claim set it, done_at) and writes
-- them just before any other entry of the event, and before changing
-- what they are read from. `n` orders the two.
CREATE VIEW outbox_unwritten_attempts AS
  SELECT e.id AS event_id, e.fence AS fence, k.kind AS kind,
    CASE k.n WHEN 1 THEN e.claimed_at ELSE e.done_at END AS at,
    e.token AS token,
    CASE k.n WHEN 1 THEN e.lease_until END AS lease_until,
    NULL AS detail, k.n AS n
  FROM outbox_events AS e
  JOIN (SELECT 1 AS n, 'claimed' AS kind UNION ALL SELECT 2, 'acknowledged') AS k
    ON e.state = 'done' OR (k.n = 1 AND e.state = 'leased')
  WHERE NOT EXISTS (SELECT 1 FROM outbox_attempts AS a
    WHERE a.event_id = e.id AND a.fence = e.fence AND a.kind = k.kind);

-- The whole ledger, what explain() reads: `seq` orders one event's entries
-- (a row's id; unwritten entries follow every written one). It orders one
-- event only: an unwritten entry's `seq` changes as rows are written.
CREATE VIEW outbox_ledger AS
  SELECT id AS seq, event_id, fence, kind, at, token, lease_until, detail
  FROM outbox_attempts
  UNION ALL
  SELECT (SELECT coalesce(max(id), 0) FROM outbox_attempts) + n, event_id,
    fence, kind, at, token, lease_until, detail
  FROM outbox_unwritten_attempts;

-- The outbox's own schema version: one row per version the database
-- reached, the highest is current. Never PRAGMA user_version, which belongs
-- to the application's own migrations (releases before this table kept
-- versions 1 to 4 there; Outbox.open() moves them here and gives
-- user_version back to the application as 0).
CREATE TABLE outbox_schema (
  version INTEGER PRIMARY KEY,
  applied_at INTEGER NOT NULL
) STRICT;

INSERT INTO outbox_schema (version, applied_at)
  VALUES (9, CAST(unixepoch('subsec') * 1000 AS INTEGER));
