//! Core's own tables ([`CORE`]), and the schema as it was while every
//! crate's tables were one numbered list here ([`LEGACY`]).
//!
//! Each crate now owns its tables and makes them itself (a [`Schema`] named
//! on every query): core's are below; the agent's journal in
//! `berth_agent::journal`, the memory in `berth_tools::memory`, the
//! schedules in `berth_schedules`. The old list stays, frozen, to bring a
//! database made by a berth of then to its last version; every schema's
//! first version makes its tables `IF NOT EXISTS` in that same shape, so on
//! such a database it changes nothing, and a new database never runs the
//! old list. `tests/schema.rs` checks that both roads end at the same tables.

use super::Schema;

/// Core's tables: sandboxes and their sessions, the event log, jobs,
/// approvals, checkpoints.
pub static CORE: Schema = Schema {
    owner: "core",
    versions: &[r#"
    CREATE TABLE IF NOT EXISTS sandboxes (
        backend     TEXT NOT NULL,
        name        TEXT NOT NULL,
        spec        TEXT NOT NULL,
        created_at  INTEGER NOT NULL,
        last_used   INTEGER NOT NULL,
        PRIMARY KEY (backend, name)
    );
    CREATE TABLE IF NOT EXISTS sessions (
        backend     TEXT NOT NULL,
        sandbox     TEXT NOT NULL,
        name        TEXT NOT NULL,
        created_at  INTEGER NOT NULL,
        last_used   INTEGER NOT NULL,
        commands    INTEGER NOT NULL DEFAULT 0,
        cwd         TEXT,
        PRIMARY KEY (backend, sandbox, name)
    );
    CREATE TABLE IF NOT EXISTS events (
        id          INTEGER PRIMARY KEY AUTOINCREMENT,
        ts_ms       INTEGER NOT NULL,
        kind        TEXT NOT NULL,
        call_id     TEXT,
        backend     TEXT,
        sandbox     TEXT,
        session     TEXT,
        command     TEXT,
        verdict     TEXT,
        exit_code   INTEGER,
        duration_ms INTEGER,
        bytes_out   INTEGER,
        detail      TEXT
    );
    CREATE INDEX IF NOT EXISTS events_call ON events(call_id);
    CREATE TABLE IF NOT EXISTS jobs (
        id          TEXT PRIMARY KEY,
        name        TEXT,
        backend     TEXT NOT NULL,
        sandbox     TEXT NOT NULL,
        command     TEXT NOT NULL,
        state       TEXT NOT NULL,
        exit_code   INTEGER,
        pid         INTEGER,
        created_at  INTEGER NOT NULL,
        ended_at    INTEGER,
        reason      TEXT,
        watch       TEXT NOT NULL DEFAULT '[]',
        scan_offset INTEGER NOT NULL DEFAULT 0,
        out_bytes   INTEGER NOT NULL DEFAULT 0,
        kill_signal TEXT,
        pty         TEXT
    );
    CREATE INDEX IF NOT EXISTS jobs_name ON jobs(name);
    CREATE TABLE IF NOT EXISTS approvals (
        id           INTEGER PRIMARY KEY AUTOINCREMENT,
        created_unix INTEGER NOT NULL,
        sandbox      TEXT NOT NULL,
        backend      TEXT NOT NULL,
        command      TEXT NOT NULL,
        part         TEXT NOT NULL,
        argv_json    TEXT NOT NULL,
        rule         TEXT NOT NULL,
        reason       TEXT NOT NULL,
        state        TEXT NOT NULL CHECK (state IN ('pending', 'approved', 'denied', 'expired')),
        always       INTEGER NOT NULL DEFAULT 0,
        decided_unix INTEGER,
        decided_by   TEXT,
        used         INTEGER NOT NULL DEFAULT 0
    );
    CREATE INDEX IF NOT EXISTS approvals_state ON approvals(state);
    CREATE TABLE IF NOT EXISTS checkpoints (
        id          TEXT PRIMARY KEY,
        backend     TEXT NOT NULL,
        sandbox     TEXT NOT NULL,
        created_ms  INTEGER NOT NULL,
        label       TEXT,
        run_id      TEXT,
        step        INTEGER,
        files       INTEGER NOT NULL,
        bytes       INTEGER NOT NULL,
        changed     INTEGER NOT NULL,
        new_bytes   INTEGER NOT NULL,
        took_ms     INTEGER NOT NULL,
        skipped     TEXT,
        origin      TEXT,
        manifest    BLOB NOT NULL,
        session     BLOB NOT NULL
    );
    CREATE INDEX IF NOT EXISTS checkpoints_sandbox ON checkpoints(backend, sandbox, created_ms);
    CREATE INDEX IF NOT EXISTS checkpoints_run ON checkpoints(run_id, step);
    CREATE TABLE IF NOT EXISTS checkpoint_bases (
        backend   TEXT NOT NULL,
        sandbox   TEXT NOT NULL,
        manifest  BLOB NOT NULL,
        PRIMARY KEY (backend, sandbox)
    );
    "#],
};

/// The schema of every crate as one list, one entry per version (`PRAGMA
/// user_version`), as berth kept it up to version 10. Frozen: it only
/// brings an older database up to that version. Append nothing here.
pub const LEGACY: &[&str] = &[
    // 1: sandboxes, sessions, the event log.
    r#"
    CREATE TABLE sandboxes (
        backend     TEXT NOT NULL,
        name        TEXT NOT NULL,
        spec        TEXT NOT NULL,
        created_at  INTEGER NOT NULL,
        last_used   INTEGER NOT NULL,
        PRIMARY KEY (backend, name)
    );
    CREATE TABLE sessions (
        backend     TEXT NOT NULL,
        sandbox     TEXT NOT NULL,
        name        TEXT NOT NULL,
        created_at  INTEGER NOT NULL,
        last_used   INTEGER NOT NULL,
        commands    INTEGER NOT NULL DEFAULT 0,
        cwd         TEXT,
        PRIMARY KEY (backend, sandbox, name)
    );
    CREATE TABLE events (
        id          INTEGER PRIMARY KEY AUTOINCREMENT,
        ts_ms       INTEGER NOT NULL,
        kind        TEXT NOT NULL,
        call_id     TEXT,
        backend     TEXT,
        sandbox     TEXT,
        session     TEXT,
        command     TEXT,
        verdict     TEXT,
        exit_code   INTEGER,
        duration_ms INTEGER,
        bytes_out   INTEGER,
        detail      TEXT
    );
    CREATE INDEX events_call ON events(call_id);
    "#,
    // 2: background jobs.
    r#"
    CREATE TABLE jobs (
        id          TEXT PRIMARY KEY,
        name        TEXT,
        backend     TEXT NOT NULL,
        sandbox     TEXT NOT NULL,
        command     TEXT NOT NULL,
        state       TEXT NOT NULL,
        exit_code   INTEGER,
        pid         INTEGER,
        created_at  INTEGER NOT NULL,
        ended_at    INTEGER,
        reason      TEXT,
        watch       TEXT NOT NULL DEFAULT '[]',
        scan_offset INTEGER NOT NULL DEFAULT 0,
        out_bytes   INTEGER NOT NULL DEFAULT 0,
        kill_signal TEXT
    );
    CREATE INDEX jobs_name ON jobs(name);
    "#,
    // 3: approvals.
    r#"
    CREATE TABLE IF NOT EXISTS approvals (
        id           INTEGER PRIMARY KEY AUTOINCREMENT,
        created_unix INTEGER NOT NULL,
        sandbox      TEXT NOT NULL,
        backend      TEXT NOT NULL,
        command      TEXT NOT NULL,
        part         TEXT NOT NULL,
        argv_json    TEXT NOT NULL,
        rule         TEXT NOT NULL,
        reason       TEXT NOT NULL,
        state        TEXT NOT NULL CHECK (state IN ('pending', 'approved', 'denied', 'expired')),
        always       INTEGER NOT NULL DEFAULT 0,
        decided_unix INTEGER,
        decided_by   TEXT,
        used         INTEGER NOT NULL DEFAULT 0
    );
    CREATE INDEX IF NOT EXISTS approvals_state ON approvals(state);
    "#,
    // 4: agent runs (`berth run`): the journal of every step and tool call.
    r#"
    CREATE TABLE runs (
        id          TEXT PRIMARY KEY,
        created_ms  INTEGER NOT NULL,
        updated_ms  INTEGER NOT NULL,
        task        TEXT NOT NULL,
        backend     TEXT NOT NULL,
        sandbox     TEXT NOT NULL,
        state       TEXT NOT NULL,
        reason      TEXT,
        setup       TEXT NOT NULL,
        parent      TEXT,
        parent_step INTEGER,
        owner_pid   INTEGER
    );
    CREATE TABLE run_messages (
        run_id  TEXT NOT NULL REFERENCES runs(id),
        seq     INTEGER NOT NULL,
        step    INTEGER NOT NULL,
        ts_ms   INTEGER NOT NULL,
        body    TEXT NOT NULL,
        PRIMARY KEY (run_id, seq)
    );
    CREATE TABLE run_steps (
        run_id      TEXT NOT NULL REFERENCES runs(id),
        step        INTEGER NOT NULL,
        provider    TEXT,
        attempts    TEXT NOT NULL,
        usage       TEXT NOT NULL,
        cost        REAL,
        started_ms  INTEGER NOT NULL,
        ended_ms    INTEGER NOT NULL,
        summary     INTEGER NOT NULL DEFAULT 0,
        PRIMARY KEY (run_id, step)
    );
    CREATE TABLE run_calls (
        run_id      TEXT NOT NULL REFERENCES runs(id),
        call_id     TEXT NOT NULL,
        step        INTEGER NOT NULL,
        idx         INTEGER NOT NULL,
        name        TEXT NOT NULL,
        args        TEXT NOT NULL,
        state       TEXT NOT NULL,
        verdict     TEXT,
        approval    INTEGER,
        result      TEXT,
        started_ms  INTEGER NOT NULL,
        ended_ms    INTEGER,
        PRIMARY KEY (run_id, call_id)
    );
    "#,
    // 5: terminal jobs: the size of a job's terminal, `COLSxROWS` (NULL: none).
    "ALTER TABLE jobs ADD COLUMN pty TEXT;",
    // 6: compactions of agent runs (created on first use by an earlier
    // build, hence IF NOT EXISTS); memory notes; the full-text index of past
    // runs' transcripts.
    r#"
    CREATE TABLE IF NOT EXISTS run_compactions (
        run_id        TEXT NOT NULL REFERENCES runs(id),
        n             INTEGER NOT NULL,
        step          INTEGER NOT NULL,
        stage         TEXT NOT NULL,
        segment       INTEGER NOT NULL,
        masked        INTEGER NOT NULL,
        summarised    INTEGER NOT NULL,
        summary       TEXT,
        summary_step  INTEGER,
        tokens_before INTEGER NOT NULL,
        tokens_after  INTEGER NOT NULL,
        window        INTEGER NOT NULL,
        note          TEXT,
        ts_ms         INTEGER NOT NULL,
        PRIMARY KEY (run_id, n)
    );
    CREATE TABLE memory_notes (
        id          INTEGER PRIMARY KEY AUTOINCREMENT,
        backend     TEXT,
        sandbox     TEXT,
        text        TEXT NOT NULL,
        author      TEXT NOT NULL,
        created_ms  INTEGER NOT NULL,
        CHECK ((backend IS NULL) = (sandbox IS NULL))
    );
    CREATE INDEX memory_notes_sandbox ON memory_notes(backend, sandbox);
    CREATE VIRTUAL TABLE memory_fts USING fts5(text, content='memory_notes', content_rowid='id');
    CREATE TRIGGER memory_notes_ai AFTER INSERT ON memory_notes BEGIN
        INSERT INTO memory_fts(rowid, text) VALUES (new.id, new.text);
    END;
    CREATE TRIGGER memory_notes_ad AFTER DELETE ON memory_notes BEGIN
        INSERT INTO memory_fts(memory_fts, rowid, text) VALUES ('delete', old.id, old.text);
    END;
    CREATE VIRTUAL TABLE run_search USING fts5(
        text, run_id UNINDEXED, seq UNINDEXED, step UNINDEXED, role UNINDEXED
    );
    CREATE TABLE run_search_state (
        run_id   TEXT PRIMARY KEY,
        last_seq INTEGER NOT NULL
    );
    "#,
    // 7: sub-agents (`delegate`): a run's link to its parent is a fork or a
    // child; a child names the parent's call that started it and its place
    // in that call's fan-out, so a resume finds it instead of starting it
    // again; its depth below the run a person started.
    r#"
    ALTER TABLE runs ADD COLUMN kind TEXT;
    ALTER TABLE runs ADD COLUMN parent_call TEXT;
    ALTER TABLE runs ADD COLUMN child_idx INTEGER;
    ALTER TABLE runs ADD COLUMN depth INTEGER NOT NULL DEFAULT 0;
    UPDATE runs SET kind = 'fork' WHERE parent IS NOT NULL;
    CREATE UNIQUE INDEX runs_child ON runs(parent, parent_call, child_idx) WHERE kind = 'child';
    "#,
    // 8: triggers: a run that waits (`wait_for`, `berth run --on`) for a
    // job's end or output, an approval's answer or a deadline. The server
    // holds the wait: it fills `outcome` when it fires, then resumes the run.
    r#"
    CREATE TABLE run_waits (
        run_id      TEXT PRIMARY KEY REFERENCES runs(id),
        call_id     TEXT,
        job         TEXT,
        pattern     TEXT,
        approval    INTEGER,
        deadline_ms INTEGER,
        log_offset  INTEGER NOT NULL DEFAULT 0,
        created_ms  INTEGER NOT NULL,
        woke_ms     INTEGER,
        outcome     TEXT,
        resumed_ms  INTEGER
    );
    "#,
    // 9: schedules (`berth schedule`): runs `berth serve` starts on a cron
    // expression; each slot's fate (started, skipped, missed) is kept; a run
    // started by one names it.
    r#"
    CREATE TABLE schedules (
        name        TEXT PRIMARY KEY,
        cron        TEXT NOT NULL,
        tz          TEXT NOT NULL,
        task        TEXT NOT NULL,
        args        TEXT NOT NULL,
        missed      TEXT NOT NULL,
        paused      INTEGER NOT NULL DEFAULT 0,
        next_ms     INTEGER,
        created_ms  INTEGER NOT NULL
    );
    CREATE TABLE schedule_fires (
        name     TEXT NOT NULL,
        slot_ms  INTEGER NOT NULL,
        fired_ms INTEGER NOT NULL,
        outcome  TEXT NOT NULL,
        note     TEXT,
        PRIMARY KEY (name, slot_ms)
    );
    ALTER TABLE runs ADD COLUMN schedule TEXT;
    "#,
    // 10: checkpoints (`berth sandbox checkpoint`, and `berth run` after each
    // step that may have written): a workspace's manifest and its sessions'
    // state, whose file contents live in packs in the sandbox. A sandbox's
    // base is the manifest of its last checkpoint or restore: the stat
    // cache the next checkpoint compares with.
    r#"
    CREATE TABLE checkpoints (
        id          TEXT PRIMARY KEY,
        backend     TEXT NOT NULL,
        sandbox     TEXT NOT NULL,
        created_ms  INTEGER NOT NULL,
        label       TEXT,
        run_id      TEXT,
        step        INTEGER,
        files       INTEGER NOT NULL,
        bytes       INTEGER NOT NULL,
        changed     INTEGER NOT NULL,
        new_bytes   INTEGER NOT NULL,
        took_ms     INTEGER NOT NULL,
        skipped     TEXT,
        origin      TEXT,
        manifest    BLOB NOT NULL,
        session     BLOB NOT NULL
    );
    CREATE INDEX checkpoints_sandbox ON checkpoints(backend, sandbox, created_ms);
    CREATE INDEX checkpoints_run ON checkpoints(run_id, step);
    CREATE TABLE checkpoint_bases (
        backend   TEXT NOT NULL,
        sandbox   TEXT NOT NULL,
        manifest  BLOB NOT NULL,
        PRIMARY KEY (backend, sandbox)
    );
    -- `berth runs rollback`: the steps after `to_step`, through `from_step`,
    -- leave the run's transcript; the journal keeps them.
    CREATE TABLE run_rollbacks (
        run_id      TEXT NOT NULL REFERENCES runs(id),
        at_ms       INTEGER NOT NULL,
        to_step     INTEGER NOT NULL,
        from_step   INTEGER NOT NULL,
        checkpoint  TEXT NOT NULL
    );
    "#,
];
