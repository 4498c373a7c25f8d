//! A blocking PostgreSQL session that sends transaction control ahead with the next statement.
//!
//! tokio-postgres's client, driven on a current-thread runtime of its own as rust-postgres's
//! blocking client drives it (the store is synchronous: one session per thread), with one
//! thing that client cannot do: pipelining. `BEGIN`, `SAVEPOINT`, `RELEASE`, `ROLLBACK TO`
//! and `SET LOCAL` are *deferred* (`defer`): nothing is sent until the session's next
//! statement, and then both go in one write, the deferred text as a simple query first, the
//! statement after it, and the server answers both before the session waits again. A
//! transaction's control statements so cost no round trip of their own (issue 33: a
//! wake-up's tick was 26 round trips, nine of them `SAVEPOINT` and `RELEASE`).
//!
//! What a deferred statement means is unchanged: the server runs it before the statement
//! sent with it, in order, in the same session. If it fails, that failure is the answer of
//! the statement sent with it (which then fails too, the transaction being aborted), so a
//! caller sees the first error, as when each went alone. `COMMIT` and a transaction's
//! `ROLLBACK` are never deferred: they are sent (with anything deferred before them) when
//! asked for, and a deferred statement that failed makes the `COMMIT` fail.
//!
//! Must not: defer anything that returns rows or a statement whose failure the caller must
//! see before it sends the next one; drop deferred text of a live transaction.
//!
//! The other way round, `trail` sends text (the dispatcher tick's `COMMIT`) and `read_after`
//! a prepared read right *after* the next statement, in the same write, in the order asked:
//! the statement's rows and the trailing answers come back before the session waits again
//! (the reads' rows are then `answered`). So the tick's claims and its commit are one round
//! trip, as are a recording's last write and its commit, and the tick's reads ride with
//! the statement before them. The statement's error comes first, then a trailing one's
//! (after an error the rest ran in an aborted transaction, where `COMMIT` rolls back). A
//! statement refused before it is written (its parameters could not be encoded) takes
//! nothing trailing with it (`trailing_went`). A `prepare` and `batch_execute` never take
//! them; the store's statements are prepared first, so the trailing items follow a whole
//! statement.

use std::collections::VecDeque;
use std::future::{Future, poll_fn};
use std::pin::pin;
use std::task::Poll;

use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres::types::ToSql;
use tokio_postgres::{AsyncMessage, Error, Notification, Row, Socket, Statement, ToStatement};

type Params<'p> = [&'p (dyn ToSql + Sync)];

/// The connection's side of the session (tokio-postgres's `Connection`, boxed over its TLS).
trait Messages: Send {
    fn poll_message(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> Poll<Option<Result<AsyncMessage, Error>>>;
}

impl<S, T> Messages for tokio_postgres::Connection<S, T>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send,
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send,
{
    fn poll_message(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> Poll<Option<Result<AsyncMessage, Error>>> {
        tokio_postgres::Connection::poll_message(self, cx)
    }
}

/// One session.
pub struct Client {
    rt: tokio::runtime::Runtime,
    conn: Box<dyn Messages>,
    inner: tokio_postgres::Client,
    /// `NOTIFY`s that arrived while a statement ran (the wake listener's).
    notes: VecDeque<Notification>,
    /// Control statements not yet sent, each ending with `;`.
    deferred: String,
    /// Session settings not yet sent (`defer_alone`), each ending with `;`.
    alone: String,
    /// What to send right after the next statement (`trail`, `read_after`), in order.
    trailing: Vec<Trail>,
    /// The rows of the reads that went after the last statement, in order.
    answered: Vec<Vec<Row>>,
    /// Whether what was to go after the last statement went (`trailing_went`).
    trailing_went: bool,
}

/// One thing sent after a statement.
enum Trail {
    Text(String),
    Read(Statement, Vec<Box<dyn ToSql + Sync + Send>>),
}

impl Client {
    /// Connect with `config` over `tls`, the session driven on `rt` (a current-thread
    /// runtime of its own).
    pub fn connect<T>(
        rt: tokio::runtime::Runtime,
        config: &tokio_postgres::Config,
        tls: T,
    ) -> Result<Client, Error>
    where
        T: MakeTlsConnect<Socket> + 'static + Send,
        T::TlsConnect: Send,
        T::Stream: Send,
        <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
    {
        let (inner, conn) = rt.block_on(config.connect(tls))?;
        Ok(Client {
            rt,
            conn: Box::new(conn),
            inner,
            notes: VecDeque::new(),
            deferred: String::new(),
            alone: String::new(),
            trailing: Vec::new(),
            answered: Vec::new(),
            trailing_went: false,
        })
    }

    /// Whether the session is gone (the server closed it, the network cut it).
    pub fn is_closed(&self) -> bool {
        self.inner.is_closed()
    }

    /// Send `sql` (control statements, no rows) ahead with the next statement.
    pub fn defer(&mut self, sql: &str) {
        self.deferred.push_str(sql);
        self.deferred.push(';');
    }

    /// Send `sql` (a session's `SET`) ahead with the next statement like `defer`, but as a
    /// query of its own: outside a transaction it takes effect for the session at once,
    /// where sent in one query with a `BEGIN` after it, it would belong to that
    /// transaction and go with its ROLLBACK.
    pub fn defer_alone(&mut self, sql: &str) {
        self.alone.push_str(sql);
        self.alone.push(';');
    }

    /// Send `sql` (statements without rows) right after the session's next statement, in
    /// the same write (see the module doc).
    pub fn trail(&mut self, sql: &str) {
        self.trailing.push(Trail::Text(sql.to_string()));
    }

    /// Send the read `stmt` with `params` right after the session's next statement, in the
    /// same write; its rows are then `answered` (see the module doc).
    pub fn read_after(&mut self, stmt: Statement, params: Vec<Box<dyn ToSql + Sync + Send>>) {
        self.trailing.push(Trail::Read(stmt, params));
    }

    /// Whether anything went after the last statement (`trail`, `read_after`): not when
    /// that statement was refused before it was written (nothing trailing went either).
    pub fn trailing_went(&self) -> bool {
        self.trailing_went
    }

    /// The rows of the reads sent after the last statement, in the order asked (taken).
    pub fn answered(&mut self) -> Vec<Vec<Row>> {
        std::mem::take(&mut self.answered)
    }

    /// Run `f`'s request, anything deferred sent ahead of it and anything trailing after
    /// it in the same write, while the session's connection is driven.
    fn run<'c, R, F>(
        &'c mut self,
        f: impl FnOnce(&'c tokio_postgres::Client) -> F,
    ) -> Result<R, Error>
    where
        F: Future<Output = Result<R, Error>>,
    {
        self.send(f, true)
    }

    /// `run`, or without what trails (`with_trailing` false: it waits for the next
    /// statement).
    fn send<'c, R, F>(
        &'c mut self,
        f: impl FnOnce(&'c tokio_postgres::Client) -> F,
        with_trailing: bool,
    ) -> Result<R, Error>
    where
        F: Future<Output = Result<R, Error>>,
    {
        // The session's settings and the deferred control text, each a query of its own.
        let ahead: Vec<String> = [
            std::mem::take(&mut self.alone),
            std::mem::take(&mut self.deferred),
        ]
        .into_iter()
        .filter(|t| !t.is_empty())
        .collect();
        let trailing = if with_trailing {
            self.answered.clear();
            self.trailing_went = false;
            std::mem::take(&mut self.trailing)
        } else {
            Vec::new()
        };
        let Client {
            rt,
            conn,
            inner,
            notes,
            answered,
            trailing_went,
            ..
        } = self;
        let inner: &'c tokio_postgres::Client = inner;
        let main = f(inner);
        if ahead.is_empty() && trailing.is_empty() {
            return drive(rt, conn, notes, main);
        }
        let (done, went) = drive(rt, conn, notes, async move {
            let ahead = async {
                let sent = ahead
                    .iter()
                    .map(|t| Box::pin(inner.batch_execute(t)))
                    .collect();
                all_in_order(sent)
                    .await
                    .into_iter()
                    .collect::<Result<(), Error>>()
            };
            let (mut ahead, mut main) = (pin!(ahead), pin!(main));
            // One poll of each, in order: the deferred text is written, then the statement,
            // or the statement is refused before anything of it is written (its parameters
            // could not be encoded, the session is closed). Then nothing trailing goes: a
            // trailing COMMIT must not commit a transaction whose statement never ran.
            let (mut ra, mut rm) = (None, None);
            poll_fn(|cx| {
                if let Poll::Ready(r) = ahead.as_mut().poll(cx) {
                    ra = Some(r);
                }
                if let Poll::Ready(r) = main.as_mut().poll(cx) {
                    rm = Some(r);
                }
                Poll::Ready(())
            })
            .await;
            if let Some(Err(e)) = rm {
                let ahead = rest(ahead, ra).await;
                return Ok((ahead.and(Err(e)), false));
            }
            let behind: Vec<_> = trailing
                .iter()
                .map(|t| {
                    Box::pin(async move {
                        match t {
                            Trail::Text(sql) => inner.batch_execute(sql).await.map(|()| None),
                            Trail::Read(stmt, params) => {
                                let refs: Vec<&(dyn ToSql + Sync)> = params
                                    .iter()
                                    .map(|p| p.as_ref() as &(dyn ToSql + Sync))
                                    .collect();
                                inner.query(stmt, &refs).await.map(Some)
                            }
                        }
                    })
                })
                .collect();
            let went = !behind.is_empty();
            let ((ahead, main), behind) = in_order(
                in_order(rest(ahead, ra), rest(main, rm)),
                all_in_order(behind),
            )
            .await;
            let done = (|| {
                ahead?;
                let r = main?;
                let mut rows = Vec::new();
                for b in behind {
                    if let Some(read) = b? {
                        rows.push(read);
                    }
                }
                Ok((r, rows))
            })();
            Ok((done, went))
        })?;
        *trailing_went = went;
        let (r, rows) = done?;
        *answered = rows;
        Ok(r)
    }

    pub fn prepare(&mut self, sql: &str) -> Result<Statement, Error> {
        self.send(|c| c.prepare(sql), false)
    }

    pub fn execute<T: ?Sized + ToStatement>(
        &mut self,
        stmt: &T,
        params: &Params<'_>,
    ) -> Result<u64, Error> {
        self.run(|c| c.execute(stmt, params))
    }

    pub fn query<T: ?Sized + ToStatement>(
        &mut self,
        stmt: &T,
        params: &Params<'_>,
    ) -> Result<Vec<Row>, Error> {
        self.run(|c| c.query(stmt, params))
    }

    pub fn query_one<T: ?Sized + ToStatement>(
        &mut self,
        stmt: &T,
        params: &Params<'_>,
    ) -> Result<Row, Error> {
        self.run(|c| c.query_one(stmt, params))
    }

    pub fn query_opt<T: ?Sized + ToStatement>(
        &mut self,
        stmt: &T,
        params: &Params<'_>,
    ) -> Result<Option<Row>, Error> {
        self.run(|c| c.query_opt(stmt, params))
    }

    /// A query's rows one at a time, each handed to `f` as it arrives (a table of any size
    /// in bounded memory). The session's error is the outer one; `f`'s error stops the read
    /// and is the inner one.
    pub fn for_each_row<E>(
        &mut self,
        sql: &str,
        mut f: impl FnMut(Row) -> Result<(), E>,
    ) -> Result<Result<(), E>, Error> {
        let none: [&(dyn ToSql + Sync); 0] = [];
        let mut rows = Box::pin(self.run(|c| c.query_raw(sql, none))?);
        loop {
            let next = {
                let Client {
                    rt, conn, notes, ..
                } = self;
                drive(rt, conn, notes, async {
                    poll_fn(|cx| futures_core::Stream::poll_next(rows.as_mut(), cx))
                        .await
                        .transpose()
                })?
            };
            match next {
                Some(row) => {
                    if let Err(e) = f(row) {
                        return Ok(Err(e));
                    }
                }
                None => return Ok(Ok(())),
            }
        }
    }

    /// Statements without parameters, sent now (with anything deferred ahead of them).
    pub fn batch_execute(&mut self, sql: &str) -> Result<(), Error> {
        self.send(|c| c.batch_execute(sql), false)
    }

    /// A transaction: `BEGIN`, deferred to the first statement in it.
    pub fn transaction(&mut self) -> Transaction<'_> {
        self.transaction_as("BEGIN")
    }

    /// A transaction started by `begin` (`BEGIN ISOLATION LEVEL ...`), deferred likewise.
    pub fn transaction_as(&mut self, begin: &str) -> Transaction<'_> {
        self.defer(begin);
        Transaction {
            client: self,
            savepoint: None,
            done: false,
        }
    }

    /// The next `NOTIFY` this session received, waiting up to `timeout` for one (zero:
    /// only one that is here already); `None` when none came or the session closed
    /// (`is_closed` says which).
    pub fn next_notification(
        &mut self,
        timeout: std::time::Duration,
    ) -> Result<Option<Notification>, Error> {
        if let Some(n) = self.notes.pop_front() {
            return Ok(Some(n));
        }
        let Client {
            rt, conn, notes, ..
        } = self;
        let mut sleep = {
            let _in = rt.enter();
            Box::pin(tokio::time::sleep(timeout))
        };
        poll_block_on(rt, conn, notes, |cx, notes, closed| {
            if let Some(n) = notes.pop_front() {
                return Poll::Ready(Ok(Some(n)));
            }
            // Closed, or only what is here already: a timer of zero would still wait for
            // the runtime's next turn of its clock (a millisecond).
            if closed || timeout.is_zero() {
                return Poll::Ready(Ok(None));
            }
            sleep.as_mut().poll(cx).map(|()| Ok(None))
        })
    }
}

/// Poll `a` before `b` every time (so `a`'s request is written first), until both are done.
async fn in_order<A: Future, B: Future>(a: A, b: B) -> (A::Output, B::Output) {
    let mut a = pin!(a);
    let mut b = pin!(b);
    let (mut ra, mut rb) = (None, None);
    poll_fn(|cx| {
        if ra.is_none()
            && let Poll::Ready(r) = a.as_mut().poll(cx)
        {
            ra = Some(r);
        }
        if rb.is_none()
            && let Poll::Ready(r) = b.as_mut().poll(cx)
        {
            rb = Some(r);
        }
        if ra.is_some() && rb.is_some() {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await;
    (ra.expect("done"), rb.expect("done"))
}

/// The output of `f`, polled already: `done` if that poll finished it.
async fn rest<F: Future>(f: std::pin::Pin<&mut F>, done: Option<F::Output>) -> F::Output {
    match done {
        Some(r) => r,
        None => f.await,
    }
}

/// Poll each of `futs` in their order every time (so their requests are written in that
/// order), until all are done.
async fn all_in_order<F: Future>(futs: Vec<std::pin::Pin<Box<F>>>) -> Vec<F::Output> {
    let mut futs = futs;
    let mut outs: Vec<Option<F::Output>> = futs.iter().map(|_| None).collect();
    poll_fn(|cx| {
        for (f, out) in futs.iter_mut().zip(outs.iter_mut()) {
            if out.is_none()
                && let Poll::Ready(r) = f.as_mut().poll(cx)
            {
                *out = Some(r);
            }
        }
        if outs.iter().all(Option::is_some) {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await;
    outs.into_iter().map(|o| o.expect("done")).collect()
}

/// Block on `fut` while the connection reads and writes (NOTIFYs kept for later).
fn drive<R>(
    rt: &tokio::runtime::Runtime,
    conn: &mut Box<dyn Messages>,
    notes: &mut VecDeque<Notification>,
    fut: impl Future<Output = Result<R, Error>>,
) -> Result<R, Error> {
    let mut fut = pin!(fut);
    poll_block_on(rt, conn, notes, |cx, _, _| fut.as_mut().poll(cx))
}

/// Block on `f` while the connection reads and writes: each time, the connection first
/// (NOTIFYs into `notes`; `closed` once it ended), then `f`.
fn poll_block_on<R>(
    rt: &tokio::runtime::Runtime,
    conn: &mut Box<dyn Messages>,
    notes: &mut VecDeque<Notification>,
    mut f: impl FnMut(
        &mut std::task::Context<'_>,
        &mut VecDeque<Notification>,
        bool,
    ) -> Poll<Result<R, Error>>,
) -> Result<R, Error> {
    rt.block_on(poll_fn(|cx| {
        let closed = loop {
            match conn.poll_message(cx) {
                Poll::Ready(Some(Ok(AsyncMessage::Notification(n)))) => notes.push_back(n),
                // Notices (a RELEASE of a savepoint that rolled back, ...) say nothing the
                // store acts on.
                Poll::Ready(Some(Ok(_))) => {}
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Err(e)),
                Poll::Ready(None) => break true,
                Poll::Pending => break false,
            }
        };
        f(cx, notes, closed)
    }))
}

/// A transaction, or a savepoint in one. Dropped without `commit`, it rolls back.
pub struct Transaction<'a> {
    client: &'a mut Client,
    savepoint: Option<String>,
    done: bool,
}

/// A transaction's statements are the session's (`Client`'s methods), sent inside it.
impl std::ops::Deref for Transaction<'_> {
    type Target = Client;
    fn deref(&self) -> &Client {
        self.client
    }
}

impl std::ops::DerefMut for Transaction<'_> {
    fn deref_mut(&mut self) -> &mut Client {
        self.client
    }
}

impl Transaction<'_> {
    /// A savepoint `name` in this transaction, deferred to its first statement.
    pub fn savepoint(&mut self, name: &str) -> Transaction<'_> {
        self.client.defer(&format!("SAVEPOINT {name}"));
        Transaction {
            client: self.client,
            savepoint: Some(name.to_string()),
            done: false,
        }
    }

    /// COMMIT (sent now); for a savepoint, `RELEASE` (deferred).
    pub fn commit(mut self) -> Result<(), Error> {
        self.done = true;
        match self.savepoint.take() {
            None => self.client.batch_execute("COMMIT"),
            Some(name) => {
                self.client.defer(&format!("RELEASE {name}"));
                Ok(())
            }
        }
    }

    /// ROLLBACK (sent now); for a savepoint, `ROLLBACK TO` and `RELEASE` (deferred).
    pub fn rollback(mut self) -> Result<(), Error> {
        self.done = true;
        self.undo()
    }

    fn undo(&mut self) -> Result<(), Error> {
        match self.savepoint.take() {
            None => self.client.batch_execute("ROLLBACK"),
            Some(name) => {
                self.client
                    .defer(&format!("ROLLBACK TO {name}; RELEASE {name}"));
                Ok(())
            }
        }
    }
}

impl Drop for Transaction<'_> {
    fn drop(&mut self) {
        if !self.done {
            // As rust-postgres's: an error here leaves the server to roll back when the
            // session's next statement or its end comes.
            let _ = self.undo();
        }
    }
}
