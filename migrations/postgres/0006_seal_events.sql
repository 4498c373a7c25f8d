-- The events of one batch as of the moment this function is called, for the seal's find
-- (SEAL_READY_EVENTS_PG_SQL in src/store/delivery.rs), which locks each ready open batch and
-- hashes its events in one statement. A statement reads every table as of its start; when
-- the lock waited for an intake that joined the batch meanwhile, a plain join would miss
-- the event that intake committed, and the stored content_hash would not cover the batch.
-- A VOLATILE function takes a snapshot of its own at each query it runs (READ COMMITTED),
-- so called for a batch once its lock is held, it reads every event the batch will hold.
CREATE FUNCTION batch_events_now(batch bigint)
    RETURNS TABLE (id bigint, event_type text, received_at double precision,
                   dedup_id text, payload text)
    LANGUAGE plpgsql VOLATILE
AS $body$
BEGIN
    RETURN QUERY
        SELECT e.id, e.event_type, e.received_at, e.dedup_id, e.payload
        FROM events e
        WHERE e.batch_id = batch AND e.excluded_at IS NULL
        ORDER BY e.id;
END
$body$;
