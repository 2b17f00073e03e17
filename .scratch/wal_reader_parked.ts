// Process A: an application's DatabaseSync holds a WAL read transaction
// (its read-mark lock on -shm) while WASM VFS connections to the same file
// open, read and close; process B updates a version row and checkpoints
// with TRUNCATE as fast as it can. A's snapshot must stay put: the version
// read twice inside one read transaction must match, and the file must pass
// integrity_check. A dropped -shm lock lets B reset the WAL under A.
import { DatabaseSync } from "node:sqlite";
import { openSqliteWasm } from "../deno/sqlite_wasm.ts";
const role = Deno.args[0];
const path = Deno.args[1] ?? "/tmp/rt2_wal_reader.db";
if (role === "writer") {
  const db = new DatabaseSync(path);
  db.exec("PRAGMA busy_timeout=5000");
  const end = Date.now() + Number(Deno.args[2] ?? 8000);
  let n = 0;
  while (Date.now() < end) {
    db.exec("BEGIN IMMEDIATE; UPDATE v SET ver = ver + 1; UPDATE t SET x = x + 1 WHERE id = (abs(random()) % 200) + 1; COMMIT;");
    await new Promise((r) => setTimeout(r, 2));
    if (++n % 5 === 0) try { db.exec("PRAGMA wal_checkpoint(TRUNCATE)"); } catch { /* busy */ }
  }
  console.log("writer commits", n);
  db.close();
  Deno.exit(0);
}
for (const f of ["", "-wal", "-shm"]) try { Deno.removeSync(path + f); } catch { /* none */ }
const app = new DatabaseSync(path);
app.exec(`PRAGMA journal_mode=${Deno.env.get("MODE") ?? "WAL"}; PRAGMA busy_timeout=5000; CREATE TABLE v (ver INTEGER); INSERT INTO v VALUES (0); CREATE TABLE t (id INTEGER PRIMARY KEY, x INTEGER, pad BLOB);`);
app.exec(`WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM c WHERE i<200) INSERT INTO t SELECT i, 0, randomblob(3000) FROM c`);
const writer = new Deno.Command(Deno.execPath(), { args: ["run", "-A", import.meta.filename!, "writer", path, "8000"], stdout: "inherit", stderr: "inherit" }).spawn();
let rounds = 0, moved = 0, busy = 0;
const end = Date.now() + 7000;
while (Date.now() < end) {
  app.exec("BEGIN");
  const v1 = app.prepare("SELECT ver FROM v").get()!.ver;
  const s1 = app.prepare("SELECT sum(x) AS s FROM t").get()!.s;
  try {
    const driver = await openSqliteWasm(path, { busyTimeoutMs: 50 } as never);
    try { await driver.query("SELECT count(*) FROM t"); } catch { busy++; }
    await driver.close();
  } catch { busy++; }
  await new Promise((r) => setTimeout(r, 20));
  const v2 = app.prepare("SELECT ver FROM v").get()!.ver;
  const s2 = app.prepare("SELECT sum(x) AS s FROM t").get()!.s;
  app.exec("COMMIT");
  if (v1 !== v2 || s1 !== s2) { moved++; console.log(`round ${rounds}: snapshot moved: ver ${v1} -> ${v2}, sum ${s1} -> ${s2}`); }
  rounds++;
}
await writer.status;
console.log("rounds", rounds, "wasm reads busy", busy, "snapshots moved", moved, "integrity", app.prepare("PRAGMA integrity_check").get()!.integrity_check);
app.close();
