-- A JSON test the statements shared with SQLite can call (store::db rewrites SQLite's
-- json_valid(x) to it): PostgreSQL 15 has no IS JSON, and a cast that fails would abort
-- the statement, so the cast runs in its own exception block. NULL is not valid JSON, as
-- in SQLite.
CREATE FUNCTION hookspool_json_valid(doc text) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
    IF doc IS NULL THEN
        RETURN false;
    END IF;
    PERFORM doc::json;
    RETURN true;
EXCEPTION WHEN others THEN
    RETURN false;
END
$$;
