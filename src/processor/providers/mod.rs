//! Helpers several bobbins of one provider share (spec 14.3.7): written once here on
//! `ctx.http` and `ctx.oauth`, never copied into a processor.

pub mod google;
