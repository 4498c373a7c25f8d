-- hookspool schema 7: state checks written as comparisons (issue 13).
-- SQLite evaluates `x IN ('a', 'b', 'c', ...)` with more than two constants by building an
-- ephemeral b-tree of the list (a pager, a page cache and an insert per constant) every
-- time it evaluates it. A CHECK constraint is evaluated on every INSERT and on every UPDATE
-- of its column, and a partial index's WHERE on every write that may move the index's
-- entry (old row and new row). So a claim, a mark and a seal each built three such trees,
-- and an event joining its batch two (first_event_id is a batches_heads column): about
-- half the SQLite time of a claim and its mark. The same sets written as comparisons
-- accept and refuse exactly the same values (NULL included: a CHECK fails only on false)
-- and cost a few comparisons.
--
-- A CHECK constraint's text is changed in place, the way SQLite documents for changing
-- constraints that no stored row can violate (https://sqlite.org/lang_altertable.html,
-- "making other kinds of table schema changes"): the rows already hold one of the listed
-- values, so no row is read or rewritten and the migration is instant on any spool.
-- `writable_schema = RESET` reloads this connection's schema; the index DDL below
-- changes the schema cookie, so every other connection reloads it too.
PRAGMA writable_schema = ON;
UPDATE sqlite_schema SET sql = replace(sql,
    'CHECK (state IN (''open'',''sealed'',''leased'',''retry'',''delivered'',''dead'',''dropped''))',
    'CHECK (state = ''open'' OR state = ''sealed'' OR state = ''leased'' OR state = ''retry'' OR state = ''delivered'' OR state = ''dead'' OR state = ''dropped'')')
    WHERE type = 'table' AND name = 'batches';
UPDATE sqlite_schema SET sql = replace(sql,
    'CHECK (outcome IN (''ok'',''retry'',''dead'',''discarded''))',
    'CHECK (outcome = ''ok'' OR outcome = ''retry'' OR outcome = ''dead'' OR outcome = ''discarded'')')
    WHERE type = 'table' AND name = 'attempts';
UPDATE sqlite_schema SET sql = replace(sql,
    'CHECK (state IN (''closed'',''open'',''half_open'',''paused''))',
    'CHECK (state = ''closed'' OR state = ''open'' OR state = ''half_open'' OR state = ''paused'')')
    WHERE type = 'table' AND name = 'destinations';
UPDATE sqlite_schema SET sql = replace(replace(sql,
    'CHECK (kind IN (''delivery'',''source_silent'',''spool'',''config''))',
    'CHECK (kind = ''delivery'' OR kind = ''source_silent'' OR kind = ''spool'' OR kind = ''config'')'),
    'CHECK (state IN (''open'',''acked'',''resolved'',''ignored''))',
    'CHECK (state = ''open'' OR state = ''acked'' OR state = ''resolved'' OR state = ''ignored'')')
    WHERE type = 'table' AND name = 'issues';
PRAGMA writable_schema = RESET;
-- The unfinished batches of a group (schema 4), by the same set written as comparisons.
-- A query that names this index says the same expression, so the planner can use it.
DROP INDEX batches_heads;
CREATE INDEX batches_heads ON batches (route, key, first_event_id)
    WHERE state = 'open' OR state = 'sealed' OR state = 'retry' OR state = 'leased';
