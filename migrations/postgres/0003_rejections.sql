-- SQLite schema 11 (migrations/0011_rejections.sql): the intake's rejections, per hour by
-- (source, reason); never a body, a header value or a query string.
CREATE TABLE rejections (
    hour   bigint NOT NULL CHECK (hour % 3600 = 0),
    source text   NOT NULL,
    reason text   NOT NULL,
    count  bigint NOT NULL CHECK (count > 0),
    PRIMARY KEY (hour, source, reason)
);
