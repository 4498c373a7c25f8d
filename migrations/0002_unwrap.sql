-- hookspool schema 2: an unwrap delivery's per-event progress on its attempt (spec 6.4.1).
ALTER TABLE attempts ADD COLUMN events_delivered INTEGER;
ALTER TABLE attempts ADD COLUMN failed_event_id INTEGER;
