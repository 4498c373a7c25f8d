-- The upgrade test's migration. tests/systemd/build-next.sh adds it, numbered one past the
-- newest real migration, to the test build only, so that `apt upgrade` in
-- tests/systemd/upgrade.sh runs a real migration on a live spool. Additive, like every
-- migration a live upgrade may run (spec 17). It records when it ran: the test checks that
-- it ran exactly once and before the new dispatcher started.
CREATE TABLE upgrade_probe (
    id INTEGER PRIMARY KEY,
    applied_at REAL NOT NULL
);
INSERT INTO upgrade_probe (applied_at) VALUES ((julianday('now') - 2440587.5) * 86400.0);
