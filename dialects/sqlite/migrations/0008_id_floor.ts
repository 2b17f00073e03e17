/**
 * SQLite schema step 8, from version 8 to 9: the table `outbox_id_floor`,
 * the highest event id ever deleted, and its triggers, which keep event ids
 * from being reused without AUTOINCREMENT (whose `sqlite_sequence` row an
 * insert writes each time). A fresh version 9 database declares the id
 * without AUTOINCREMENT; an upgraded one keeps its declaration (SQLite
 * cannot drop it without rebuilding the table), so its floor starts at its
 * `sqlite_sequence` counter, the highest id it ever handed out: every id
 * deleted before the upgrade is at or below it. The trigger texts are
 * schema.sql's, so a fresh database and an upgraded one read the same.
 *
 * Frozen: released, so its text never changes. A later change to the
 * schema is a new numbered step; schema.sql is the fresh database.
 *
 * @module
 */

/** The step from version 8 to 9, run in the opening transaction. */
export const MIGRATION_0008: string = `CREATE TABLE outbox_id_floor (
  seq INTEGER NOT NULL
) STRICT;

INSERT INTO outbox_id_floor (seq)
  SELECT coalesce((SELECT max(seq) FROM sqlite_sequence
    WHERE name = 'outbox_events'), 0);

CREATE TRIGGER outbox_events_deleted AFTER DELETE ON outbox_events
  WHEN OLD.id > (SELECT seq FROM outbox_id_floor)
BEGIN
  UPDATE outbox_id_floor SET seq = OLD.id;
END;

CREATE TRIGGER outbox_events_id_reused AFTER INSERT ON outbox_events
  WHEN NEW.id <= (SELECT seq FROM outbox_id_floor)
BEGIN
  SELECT RAISE(ABORT, 'outbox_events: this id belonged to a deleted event; insert with an id above outbox_id_floor.seq');
END;`;
