//! The journal's tables: agent runs, their messages, steps and tool calls,
//! compactions, waits and rollbacks. This crate makes them on first use
//! (see `berth_core::store::Schema`) and is the only one that queries them.

use berth_core::store::Schema;

/// The agent's tables.
pub static TABLES: Schema = Schema {
    owner: "agent",
    versions: &[r#"
    CREATE TABLE IF NOT EXISTS runs (
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
        owner_pid   INTEGER,
        kind        TEXT,
        parent_call TEXT,
        child_idx   INTEGER,
        depth       INTEGER NOT NULL DEFAULT 0,
        schedule    TEXT
    );
    CREATE UNIQUE INDEX IF NOT EXISTS runs_child ON runs(parent, parent_call, child_idx) WHERE kind = 'child';
    CREATE TABLE IF NOT EXISTS run_messages (
        run_id  TEXT NOT NULL REFERENCES runs(id),
        seq     INTEGER NOT NULL,
        step    INTEGER NOT NULL,
        ts_ms   INTEGER NOT NULL,
        body    TEXT NOT NULL,
        PRIMARY KEY (run_id, seq)
    );
    CREATE TABLE IF NOT EXISTS run_steps (
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
    CREATE TABLE IF NOT EXISTS run_calls (
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
    CREATE TABLE IF NOT EXISTS run_waits (
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
    CREATE TABLE IF NOT EXISTS run_rollbacks (
        run_id      TEXT NOT NULL REFERENCES runs(id),
        at_ms       INTEGER NOT NULL,
        to_step     INTEGER NOT NULL,
        from_step   INTEGER NOT NULL,
        checkpoint  TEXT NOT NULL
    );
    "#],
};
