-- hookspool schema 5: indexes a delivery's state changes leave alone (issue 13).
-- A claim (sealed -> leased) and a mark (leased -> delivered or retry) change only a batch's
-- state and its attempt columns. Every index holding `state` moved the batch's entry on
-- each change, and the group index, ordered by key, put a tick's moves on as many pages as
-- the tick had keys. These indexes hold only the batches their queries look for, so a
-- delivery rewrites none of them. `state` stays their first column: the planner, which has
-- no statistics, then sees an equality and a range, as before, and prefers them.
DROP INDEX batches_group;
-- A group's batches, whatever their state (the replay warning), and its open batch (the
-- join rule of every enqueue, spec 5).
CREATE INDEX batches_group ON batches (route, key);
CREATE INDEX batches_open ON batches (route, key, state) WHERE state = 'open';
-- Retries by due time (the config redue).
DROP INDEX batches_due;
CREATE INDEX batches_due ON batches (state, next_attempt_at) WHERE state = 'retry';
-- Readiness of open batches (seal_ready), one index per rule as before.
DROP INDEX batches_quiet_due;
CREATE INDEX batches_quiet_due ON batches (state, last_at + quiet_s) WHERE state = 'open';
DROP INDEX batches_max_due;
CREATE INDEX batches_max_due ON batches (state, first_at + max_s) WHERE state = 'open';
DROP INDEX batches_immediate;
CREATE INDEX batches_immediate ON batches (state, quiet_s + max_s) WHERE state = 'open';
