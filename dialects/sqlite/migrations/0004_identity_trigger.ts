/**
 * SQLite schema step 4, from version 4 to 5: rows other writers inserted
 * without an identity get one now, and the trigger gives later ones theirs.
 *
 * Frozen: released, so its text never changes. A later change to the
 * schema is a new numbered step; schema.sql is the fresh database.
 *
 * @module
 */

/** The step from version 4 to 5, run in the opening transaction. */
export const MIGRATION_0004: string = `UPDATE outbox_events SET identity = (
      SELECT substr(t, 1, 8) || '-' || substr(t, 9, 4) || '-7' || substr(r, 1, 3)
        || '-' || substr('89ab89ab89ab89ab', instr('0123456789abcdef', substr(r, 4, 1)), 1)
        || substr(r, 5, 3) || '-' || substr(r, 8, 12)
      FROM (SELECT printf('%012x', created_at & 0xffffffffffff) AS t,
        lower(hex(randomblob(10))) AS r)) WHERE identity IS NULL; CREATE TRIGGER outbox_events_fill_identity AFTER INSERT ON outbox_events
  WHEN NEW.identity IS NULL
BEGIN
  UPDATE outbox_events SET identity = (
    SELECT substr(t, 1, 8) || '-' || substr(t, 9, 4) || '-7' || substr(r, 1, 3)
      || '-' || substr('89ab89ab89ab89ab', instr('0123456789abcdef', substr(r, 4, 1)), 1)
      || substr(r, 5, 3) || '-' || substr(r, 8, 12)
    FROM (SELECT printf('%012x', NEW.created_at & 0xffffffffffff) AS t,
      lower(hex(randomblob(10))) AS r))
  WHERE id = NEW.id;
END;`;
