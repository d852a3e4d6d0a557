"""``sam-index PATH... [--db FILE]``: every run folder under PATH into one SQLite database.

Tables (the standard library's sqlite3; any SQL client, pandas or DuckDB reads them):

- ``runs``: one row per run folder: ``run_dir`` (absolute), ``sweep_dir`` (the sweep folder it
  was found in; a run folder given itself: its own folder), ``status`` (``unreadable`` for a
  folder with a file that cannot be read, ``problem`` naming it), ``indexed_at`` (UTC,
  ISO 8601), every flattened config key named as in overrides (``optimizer.rho``), every
  ``summary.json`` value under its own name (``test_acc``; nested ones dotted:
  ``versions.torch``; a name the config already has gets ``summary.``), and sam-eval's and
  sam-landscape's numbers prefixed by their file: ``eval.lambda_max``,
  ``eval_averaged.test_acc``, ``landscape.basin_width_1d``, ``landscape_averaged.…``;
- ``epochs``: one row per ``metrics.jsonl`` line: ``run_dir``, ``epoch``, ``step``, then one
  column per key of the lines;
- ``files`` and ``meta``: what each folder's files were when it was read, and the schema.

Incremental: a folder whose files' sizes and modification times did not change is not read
again; a folder gone from under a PATH loses its rows. One indexer of a database at a time (a
lock file ``.<db name>.lock`` beside it): a second one says who holds it, waits, and then finds
the folders unchanged instead of reading them again. Readers (``--query``) never wait: WAL, a
busy timeout, one transaction per folder. A schema of another version is dropped and rebuilt.
The run folders are only read, never written.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import json
import sqlite3
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from .. import interrupts
from ..cli_words import say_version
from ..errors import UserError, check_names, require
from ..rundir import (
    CONFIG,
    LANDSCAPE_SUMMARY,
    METRICS,
    OVERRIDES,
    SUMMARY,
    RunDir,
    eval_file,
    has_checkpoint,
    is_run,
    job_dirs,
    landscape_folder,
    require_sam_run_jobs,
)
from ..runfiles import atomic_write_bytes
from ..settings import flatten

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator, Sequence

SCHEMA = 1  # bump when the tables' meaning changes: an older database is rebuilt by itself
DEFAULT_DB = "sam-results.sqlite"
BUSY_TIMEOUT_S = 60
WATCHED = (  # the files a row is made of: a change of any re-reads the folder
    SUMMARY,
    METRICS,
    str(CONFIG),
    str(OVERRIDES),
    eval_file("last"),
    eval_file("averaged"),
    f"{landscape_folder('last')}/{LANDSCAPE_SUMMARY}",
    f"{landscape_folder('averaged')}/{LANDSCAPE_SUMMARY}",
)
SKIPPED_SUMMARY_KEYS = ("config", "reliability")  # the config has its own columns; bins are big
TABLES = {
    "runs": "run_dir TEXT PRIMARY KEY, sweep_dir TEXT, status TEXT, indexed_at TEXT",
    "epochs": "run_dir TEXT, epoch REAL, step REAL",
    "files": "run_dir TEXT PRIMARY KEY, signature TEXT",
    "meta": "key TEXT PRIMARY KEY, value TEXT",
}


def quote(name: str) -> str:
    """``name`` as an SQL identifier (double quotes, inner ones doubled)."""
    return '"' + name.replace('"', '""') + '"'


SQLITE_HEADER = b"SQLite format 3\x00"  # the first 16 bytes of every SQLite database file


def require_database_file(db: Path) -> None:
    """``--db`` names an SQLite file, or nothing yet: another file is refused before anything
    is written beside it (the indexer's lock file)."""
    db = Path(db)
    require(not db.is_dir(), f"--db {db} is a folder; give a database file (--db results.sqlite)")
    try:
        with db.open("rb") as f:
            head = f.read(len(SQLITE_HEADER))
    except FileNotFoundError:
        return
    except OSError as e:
        raise UserError(f"--db {db} cannot be read ({e.strerror or e})") from None
    require(
        head in (b"", SQLITE_HEADER),
        f"--db {db} is not an SQLite database (it holds other data); choose another file",
    )


def require_query_parses(sql: str) -> None:
    """A query's syntax, checked on an empty database of the same tables before any folder is
    indexed (a typo wrote the database, then failed); columns are the folders', not checked."""
    con = sqlite3.connect(":memory:")
    try:
        for t, cols in TABLES.items():
            con.execute(f"CREATE TABLE {t} ({cols})")
        con.execute(f"EXPLAIN {sql}")
    except sqlite3.Error as e:
        if "syntax error" in str(e) or "incomplete input" in str(e):
            raise UserError(f"--query failed: {e} (tables: runs, epochs)") from None
    finally:
        con.close()


def connect(db: Path) -> sqlite3.Connection:
    """The database, in WAL mode with a busy timeout, its schema current (rebuilt if not)."""
    try:
        con = sqlite3.connect(str(db), timeout=BUSY_TIMEOUT_S, isolation_level=None)
        con.execute("PRAGMA journal_mode=WAL")
        con.execute(
            "PRAGMA synchronous=NORMAL"
        )  # WAL: a crash loses the last commits, never the file
        con.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_S * 1000}")
    except sqlite3.Error as e:
        raise UserError(f"--db {db}: cannot open it as an SQLite database ({e})") from None
    con.execute("BEGIN IMMEDIATE")
    try:
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        version = None
        if "meta" in tables:
            row = con.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
            version = row[0] if row else None
        if version != str(SCHEMA) or not set(TABLES) <= tables:  # a table dropped: all anew
            for t in tables:
                con.execute(f"DROP TABLE {quote(t)}")
            for t, cols in TABLES.items():
                con.execute(f"CREATE TABLE {t} ({cols})")
            con.execute("CREATE INDEX epochs_run ON epochs (run_dir)")
            con.execute("INSERT INTO meta VALUES ('schema', ?)", (str(SCHEMA),))
        con.execute("COMMIT")
    except sqlite3.DatabaseError as e:
        con.execute("ROLLBACK")
        raise UserError(f"--db {db} is not a results database ({e}); choose another file") from None
    return con


def signature(run_dir: Path) -> str:
    """Size and modification time of each watched file (absent: null): no file is read."""
    out = {}
    for name in WATCHED:
        try:
            st = (run_dir / name).stat()
            out[name] = [st.st_size, st.st_mtime_ns]
        except OSError:
            out[name] = None
    return json.dumps(out, sort_keys=True)


def _value(v):
    if isinstance(v, bool):
        return int(v)
    if v is None or isinstance(v, (int, float, str)):
        return v
    return json.dumps(v)


def run_row(run: RunDir, sweep_dir: Path) -> dict:
    """The ``runs`` row of one folder (see the module docstring)."""
    row = {"run_dir": str(run.path), "sweep_dir": str(sweep_dir), "status": run.status}
    row["indexed_at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    config = {k: v for k, v in flatten(run.config(checkpoint=False)).items() if k != "hydra"}
    row.update({k: _value(v) for k, v in config.items()})
    summary = {k: v for k, v in (run.summary or {}).items() if k not in SKIPPED_SUMMARY_KEYS}
    for k, v in flatten(summary).items():
        row["summary." + k if k in row else k] = _value(v)
    for weights in ("last", "averaged"):
        prefix = eval_file(weights).removesuffix(".json")
        for k, v in flatten(run.eval(weights) or {}).items():
            row[f"{prefix}.{k}"] = _value(v)
    for weights in ("last", "averaged"):
        prefix = landscape_folder(weights)
        for k, v in flatten(run.landscape(weights) or {}).items():
            if not isinstance(v, (dict, list)):
                row[f"{prefix}.{k}"] = _value(v)
    return row


_known: dict = {}  # (connection id, table) -> columns seen: re-read only when a key is new


def _columns(con, table: str) -> set:
    cols = {r[1] for r in con.execute(f"PRAGMA table_info({quote(table)})")}
    _known[(id(con), table)] = cols
    return cols


def _insert(con, table: str, rows: list[dict], verb: str = "INSERT") -> None:
    if not rows:
        return
    keys = list(dict.fromkeys(k for r in rows for k in r))
    have = _known.get((id(con), table), set())
    if not set(keys) <= have:  # inside the write lock: another indexer may have added them
        have = _columns(con, table)
        for k in keys:
            if k not in have:
                con.execute(f"ALTER TABLE {quote(table)} ADD COLUMN {quote(k)}")
                have.add(k)
    sql = (
        f"{verb} INTO {quote(table)} ({', '.join(map(quote, keys))}) "
        f"VALUES ({', '.join('?' * len(keys))})"
    )
    con.executemany(sql, [[r.get(k) for k in keys] for r in rows])


def _delete(con, run_dir: str) -> None:
    for table in ("runs", "epochs", "files"):
        con.execute(f"DELETE FROM {table} WHERE run_dir = ?", (run_dir,))


def index_folder(con: sqlite3.Connection, run_dir: Path, sweep_dir: Path) -> str:
    """``read``, ``unchanged`` or ``unreadable``: a file of the folder is there but cannot be
    read (corrupt, or its permissions): one warning line naming it, and a row with status
    ``unreadable`` and the reason in ``problem``, holding what could be read; such a folder is
    read again each time (mended permissions do not change a file's size or time)."""
    sig = signature(run_dir)
    old = con.execute(
        "SELECT signature, status FROM files LEFT JOIN runs USING (run_dir) WHERE run_dir = ?",
        (str(run_dir),),
    ).fetchone()
    if old and old[0] == sig and old[1] != "unreadable" and _has_rows(con, run_dir):
        return "unchanged"
    run = RunDir(run_dir)
    logged, problem = run.checked_rows()
    row = run_row(run, sweep_dir)
    if problem:
        print(
            f"sam-index: warning: {run_dir}: {problem}; indexed with status unreadable",
            file=sys.stderr,
        )
        row.update(status="unreadable", problem=problem)
    lines = [{"run_dir": str(run_dir), **{k: _value(v) for k, v in r.items()}} for r in logged]
    con.execute("BEGIN IMMEDIATE")
    try:
        _delete(con, str(run_dir))
        _insert(con, "runs", [row])
        _insert(con, "epochs", lines)
        _insert(con, "files", [{"run_dir": str(run_dir), "signature": sig}])
        con.execute("COMMIT")
    except BaseException:
        if con.in_transaction:  # a signal can land just after the COMMIT: nothing to undo then
            con.execute("ROLLBACK")
        raise
    return "unreadable" if problem else "read"


def _has_rows(con, run_dir: Path) -> bool:
    """Whether the database still holds the folder's rows (a user's DELETE may have removed
    them): its runs row, and epochs rows where it logged metrics lines."""
    has = lambda table: con.execute(  # noqa: E731
        f"SELECT 1 FROM {table} WHERE run_dir = ? LIMIT 1", (str(run_dir),)
    ).fetchone()
    logged = (run_dir / METRICS).is_file() and (run_dir / METRICS).stat().st_size > 0
    return bool(has("runs")) and (bool(has("epochs")) or not logged)


def folders(path: Path) -> list[tuple[Path, Path]]:
    """(run folder, its sweep folder) of every run under PATH (absolute)."""
    path = path.resolve()
    if (is_run(path) or has_checkpoint(path)) and not job_dirs(path):
        sweep = path.parent if (path.parent / "multirun.yaml").is_file() else path
        return [(path, sweep)]
    return [(d.resolve(), path) for d in job_dirs(path)]


def index(paths: Iterable[Path | str], db: Path) -> dict:
    """Index every run folder under ``paths`` into ``db``; the counts of what was done."""
    require_database_file(db)
    found_in = {}
    for p in paths:
        require(Path(p).is_dir(), f"PATH={str(p)!r} is not a folder; pass run or sweep folders")
        found_in[p] = found = folders(Path(p))
        require(
            bool(found),
            f"PATH={str(p)!r} holds no run: no .hydra/ or summary.json in it or in a folder "
            "under it; pass a run folder or a sweep folder of sam-run",
        )
        require_sam_run_jobs(Path(p).resolve(), [d for d, _ in found], shown=p)
    with indexer_lock(Path(db)):
        con = connect(db)
        counts = {"read": 0, "unchanged": 0, "unreadable": 0, "removed": 0}
        try:
            for p in paths:
                found = found_in[p]
                for run_dir, sweep_dir in found:
                    counts[index_folder(con, run_dir, sweep_dir)] += 1
                present = {str(d) for d, _ in found}
                counts["removed"] += _remove_gone(con, Path(p).resolve(), present)
        finally:
            _forget(con)
            con.close()
    return counts


@contextlib.contextmanager
def indexer_lock(db: Path) -> Iterator[None]:
    """One indexer of ``db`` at a time: a second waits (saying who it waits for), then finds the
    folders unchanged instead of reading them again."""
    from ..lock import job_lock

    folder = db.resolve().parent
    require(folder.is_dir(), f"--db {db}: its folder {folder} does not exist")
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(job_lock(folder, db.name, "wait", "sam-index"))
        except OSError as e:
            raise UserError(f"--db {db}: cannot write in {folder} ({e.strerror or e})") from None
        yield


def _forget(con) -> None:
    for key in [k for k in _known if k[0] == id(con)]:
        del _known[key]


def _remove_gone(con, root: Path, present: set) -> int:
    """Delete the rows of folders under ``root`` that are no longer there."""
    rows = con.execute(
        "SELECT run_dir FROM files WHERE run_dir = ? OR run_dir LIKE ? ESCAPE '\\'",
        (str(root), _like_prefix(root)),
    ).fetchall()
    gone = [r[0] for r in rows if r[0] not in present]
    for run_dir in gone:
        con.execute("BEGIN IMMEDIATE")
        _delete(con, run_dir)
        con.execute("COMMIT")
    return len(gone)


def _like_prefix(root: Path) -> str:
    text = str(root).rstrip("/") + "/"
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def query(db: Path, sql: str) -> tuple[list[str], list[tuple]]:
    """The columns and rows of ``sql`` on the index ``db`` (one line for a bad query)."""
    require(Path(db).is_file(), f"--db {db} does not exist; index folders first: sam-index PATH")
    require_database_file(db)
    con = connect(db)
    try:
        cur = con.execute(sql)
        return [d[0] for d in cur.description or []], cur.fetchall()
    except sqlite3.Error as e:
        raise UserError(f"--query failed: {e} (tables: runs, epochs)") from None
    finally:
        con.close()


def selected_runs(db: Path, where: str | None) -> list[tuple[str, str]]:
    """(run_dir, sweep_dir) of the runs the condition selects (sam-report --db --where)."""
    sql = "SELECT run_dir, sweep_dir FROM runs" + (f" WHERE {where}" if where else "")
    try:
        _, rows = query(db, sql + " ORDER BY sweep_dir, run_dir")
    except UserError as e:
        raise UserError(str(e).replace("--query failed", f"--where {where!r} failed")) from None
    require(bool(rows), f"no run of {db} matches --where {where!r}")
    return [(str(a), str(b)) for a, b in rows]


def table_text(cols: list[str], rows: list[tuple]) -> str:
    """A fixed-width text table (numbers as %.6g)."""
    cells = [[_show(v) for v in r] for r in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(cols)]
    line = lambda vals: "  ".join(v.ljust(w) for v, w in zip(vals, widths)).rstrip()  # noqa: E731
    return "\n".join([line(cols), line(["-" * w for w in widths]), *map(line, cells)])


def _show(v) -> str:
    if v is None:
        return ""
    return format(v, ".6g") if isinstance(v, float) else str(v)


def parser() -> argparse.ArgumentParser:
    """``sam-index``'s argument parser."""
    ap = argparse.ArgumentParser(
        prog="sam-index",
        description="Index run and sweep folders into an SQLite database (tables runs, epochs).",
        epilog='Example: sam-index multirun/ --query \'SELECT "optimizer.name", avg(test_acc) '
        "FROM runs GROUP BY 1'",
    )
    ap.add_argument("paths", nargs="*", type=Path, metavar="PATH", help="run or sweep folders")
    ap.add_argument("--db", type=Path, default=Path(DEFAULT_DB), help=f"default {DEFAULT_DB}")
    ap.add_argument("--query", metavar="SQL", help="print the result of a query as a table")
    ap.add_argument("--csv", type=Path, metavar="FILE", help="write the query's result as CSV")
    return ap


def write_csv(path: Path, cols: Sequence[str], rows: Iterable[Sequence]) -> None:
    """A query's result as CSV (a place that cannot be written: one line)."""
    text = io.StringIO(newline="")
    csv.writer(text).writerows([cols, *rows])
    try:
        atomic_write_bytes(path, text.getvalue().encode())  # an interruption leaves no half file
    except OSError as e:
        raise UserError(
            f"--csv {path} cannot be written ({e.strerror or e}); choose a writable place"
        ) from None


def main(argv: Sequence[str] | None = None) -> int:
    """``sam-index``: index run folders, or query the index; the exit status."""
    if say_version(sys.argv[1:] if argv is None else argv):
        return 0
    interrupts.catch_signals()
    try:
        return index_main(argv)
    except KeyboardInterrupt:  # each folder's rows go in one transaction: all of them or none
        interrupts.stopping()
        print(
            interrupts.said(
                "sam-index",
                "interrupted; the folders indexed so far are kept: run the same "
                "command again to index the rest",
            ),
            file=sys.stderr,
        )
        return interrupts.exit_code()


def index_main(argv: Sequence[str] | None) -> int:
    """``sam-index`` after ``--version``: its arguments parsed and run; the exit status."""
    args = parser().parse_args(argv)
    try:
        require(args.paths or args.query, "give PATH... to index, or --query SQL (or both)")
        require(args.csv is None or args.query, "--csv writes a query's result: add --query SQL")
        check_names(*args.paths, args.db, args.csv)
        if args.query:
            require_query_parses(args.query)
        if args.paths:
            c = index(args.paths, args.db)
            print(
                f"sam-index: {sum(c.values()) - c['removed']} run folder(s): {c['read']} read, "
                f"{c['unchanged']} unchanged, {c['unreadable']} unreadable, {c['removed']} "
                f"removed; database {args.db}"
            )
        if args.query:
            cols, rows = query(args.db, args.query)
            if args.csv is not None:
                write_csv(args.csv, cols, rows)
            else:
                print(table_text(cols, rows))
    except UserError as e:
        interrupts.raise_pending()  # a signal a library turned into an error
        print(f"sam-index: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
