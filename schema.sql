-- leased-outbox schema, version 1 (stored in PRAGMA user_version).
-- Applied once by Outbox.open() inside one BEGIN IMMEDIATE transaction.

-- One row per event. AUTOINCREMENT: ids are never reused, even after purge(),
-- because recipients dedupe on `${id}:${fence}`. `due_at` is when the event can next be claimed: the end
-- of its delay while pending, its lease deadline while leased (SQS's
-- visibility timeout), so one index serves both "pending and due" and
-- "lease lapsed" claims.
CREATE TABLE outbox_events (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  queue TEXT NOT NULL,
  state TEXT NOT NULL CHECK (state IN ('pending', 'leased', 'done', 'dead')),
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
  done_at INTEGER
) STRICT;

-- Matches the claim query exactly (queue =, state IN, due_at <=, ORDER BY
-- due_at, id): done and dead rows are not in it, so they cost claims nothing.
CREATE INDEX outbox_events_claim ON outbox_events (queue, due_at, id)
  WHERE state IN ('pending', 'leased');

-- Leases on an event's last attempt: once lapsed they are dead letters.
CREATE INDEX outbox_events_last_attempt ON outbox_events (due_at)
  WHERE state = 'leased' AND attempt >= max_attempts;

-- Idempotent enqueue: the key stays after the event is done.
CREATE UNIQUE INDEX outbox_events_dedup ON outbox_events (queue, dedup_key)
  WHERE dedup_key IS NOT NULL;

-- Per-key FIFO: finds an earlier unfinished event with the same ordering key.
CREATE INDEX outbox_events_ordering ON outbox_events (queue, ordering_key, id)
  WHERE state IN ('pending', 'leased') AND ordering_key IS NOT NULL;

-- Retention: purge() deletes done rows by completion time.
CREATE INDEX outbox_events_done ON outbox_events (done_at)
  WHERE state = 'done';

-- The attempt ledger behind explain(): one row per claim, renewal, release,
-- acknowledgement, stale call, lease expiry, dead letter and retry.
CREATE TABLE outbox_attempts (
  id INTEGER PRIMARY KEY,
  event_id INTEGER NOT NULL,
  fence INTEGER NOT NULL,
  kind TEXT NOT NULL CHECK (kind IN (
    'claimed', 'renewed', 'released', 'acknowledged', 'stale_acknowledge',
    'stale_renew', 'stale_release', 'expired', 'dead', 'retried'
  )),
  at INTEGER NOT NULL,
  token TEXT,
  lease_until INTEGER,
  detail TEXT
) STRICT;

CREATE INDEX outbox_attempts_event ON outbox_attempts (event_id, id);

-- The ledger entries of the hot paths are written by triggers, inside the
-- statement that changes the event, so a claim or an acknowledgement costs no
-- extra statement. The other entries are rare and written by lease.ts.
CREATE TRIGGER outbox_events_claimed AFTER UPDATE OF fence ON outbox_events
WHEN NEW.fence > OLD.fence
BEGIN
  INSERT INTO outbox_attempts (event_id, fence, kind, at, detail)
    SELECT OLD.id, OLD.fence, 'expired', NEW.updated_at, 'lease expired'
    WHERE OLD.state = 'leased';
  INSERT INTO outbox_attempts (event_id, fence, kind, at, token, lease_until)
    VALUES (NEW.id, NEW.fence, 'claimed', NEW.updated_at, NEW.token, NEW.lease_until);
END;

CREATE TRIGGER outbox_events_acknowledged AFTER UPDATE OF state ON outbox_events
WHEN OLD.state = 'leased' AND NEW.state = 'done'
BEGIN
  INSERT INTO outbox_attempts (event_id, fence, kind, at, token)
    VALUES (NEW.id, NEW.fence, 'acknowledged', NEW.done_at, NEW.token);
END;

PRAGMA user_version = 1;
