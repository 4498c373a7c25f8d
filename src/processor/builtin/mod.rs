//! The built-in processors, one file each, written against [`Context`] and
//! `providers::google`. A processor returns items; the runtime journals, applies and emits.
//!
//! Must not: talk HTTP except through the context and provider helpers, read the
//! environment or files (rule packs go through `mailrules`), sleep or loop on errors.

mod calendar;
mod drive;
mod gmail;

use super::contract::Batch;
use super::{Context, Item, ProcessorError};

/// The built-ins by their `[processor] builtin = "..."` (or `[poll] builtin = "..."`,
/// `super::pollers`) name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Builtin {
    GoogleGmail,
    GoogleCalendar,
    GoogleDrive,
    /// A poller (spec 14.4): any Atom or RSS feed.
    HookspoolFeed,
    /// A poller (spec 14.4): Google Tasks, which has no push.
    GoogleTasks,
}

impl Builtin {
    pub const ALL: [Builtin; 5] = [
        Builtin::GoogleGmail,
        Builtin::GoogleCalendar,
        Builtin::GoogleDrive,
        Builtin::HookspoolFeed,
        Builtin::GoogleTasks,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Builtin::GoogleGmail => "google.gmail",
            Builtin::GoogleCalendar => "google.calendar",
            Builtin::GoogleDrive => "google.drive",
            Builtin::HookspoolFeed => "hookspool.feed",
            Builtin::GoogleTasks => "google.tasks",
        }
    }

    pub fn from_name(name: &str) -> Option<Builtin> {
        Builtin::ALL.into_iter().find(|b| b.name() == name)
    }

    /// Runs the processor (or the poller) on one batch.
    pub async fn process(
        self,
        batch: &Batch,
        ctx: &mut Context,
    ) -> Result<Vec<Item>, ProcessorError> {
        match self {
            Builtin::GoogleGmail => gmail::process(batch, ctx).await,
            Builtin::GoogleCalendar => calendar::process(batch, ctx).await,
            Builtin::GoogleDrive => drive::process(batch, ctx).await,
            Builtin::HookspoolFeed => super::pollers::feed::poll(batch, ctx).await,
            Builtin::GoogleTasks => super::pollers::tasks::poll(batch, ctx).await,
        }
    }
}
