-- hookspool schema 11: the intake's rejections, per hour by (source, reason) (issue 31: the
-- dashboard's "rejections by reason"). The intake counts requests it answers without
-- storing them in memory and adds its counts here inside its next group transaction, or in
-- a small transaction of their own at most every few seconds when nothing commits, so a
-- flood of bad signatures never becomes a flood of writes. The admin service, a separate
-- process, reads them. A row holds a configured source's name, a reason from the intake's
-- fixed vocabulary (`unverified`, `too_large`, ...), the Unix second its hour began and a
-- count: never a body, a header value or a query string. Retention forgets old hours.
CREATE TABLE rejections (
    hour   INTEGER NOT NULL CHECK (hour % 3600 = 0),
    source TEXT    NOT NULL,
    reason TEXT    NOT NULL,
    count  INTEGER NOT NULL CHECK (count > 0),
    PRIMARY KEY (hour, source, reason)
);
