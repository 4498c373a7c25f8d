//! The destination circuit breaker and operator pause (spec 4.2, 6.3), pure: functions over
//! a `DestinationRow` that the dispatcher persists. Trips after `trip_after` consecutive
//! transport failures; cooldown doubles from cooldown_initial_s to cooldown_max_s; in
//! half_open exactly one rotating probe; only a probe (an attempt started after opened_at)
//! can re-trip; any success closes. Paused is operator-only and nothing here leaves it.

use crate::config::Breaker;
use crate::store::DestinationRow;
use crate::vocab::BreakerState;

/// What the gate allows this tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    /// Paused, open in cooldown, a probe in flight, or a Retry-After deadline: claim nothing.
    Closed,
    /// half_open: claim exactly one batch as a probe.
    Probe,
    /// closed: claim normally.
    Open,
}

/// The gate for `d` at `now`. Moves open -> half_open when the cooldown has passed (the
/// caller persists the row when it changed).
pub fn gate(d: &mut DestinationRow, now: f64) -> Gate {
    if d.retry_after_until.is_some_and(|t| t > now) {
        return Gate::Closed;
    }
    match d.state {
        BreakerState::Paused => Gate::Closed,
        BreakerState::Open => {
            let until = d.opened_at.unwrap_or(now) + d.cooldown_s.unwrap_or(0.0);
            if now >= until {
                d.state = BreakerState::HalfOpen;
                gate(d, now)
            } else {
                Gate::Closed
            }
        }
        BreakerState::HalfOpen => {
            if d.probe_until.is_some_and(|t| t > now) {
                Gate::Closed
            } else {
                Gate::Probe
            }
        }
        BreakerState::Closed => Gate::Open,
    }
}

/// What an outcome did to the breaker, for logs and issues.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effect {
    None,
    Tripped,
    Retripped,
    /// A success closed an open or half-open breaker: the destination is proven healthy,
    /// so the engine makes its transport- and throttle-class retries due now.
    Closed,
}

/// A successful attempt on the destination.
pub fn on_success(d: &mut DestinationRow, now: f64) -> Effect {
    d.consecutive_failures = 0;
    d.last_ok_at = Some(now);
    d.last_error = None;
    let was = d.state;
    match was {
        // Only resume leaves paused.
        BreakerState::Paused => return Effect::None,
        BreakerState::Closed | BreakerState::Open | BreakerState::HalfOpen => {}
    }
    d.state = BreakerState::Closed;
    d.opened_at = None;
    d.cooldown_s = None;
    d.probe_until = None;
    match was {
        BreakerState::Closed | BreakerState::Paused => Effect::None,
        BreakerState::Open | BreakerState::HalfOpen => Effect::Closed,
    }
}

/// A finished probe that neither succeeded nor failed on transport (a neutral class, such
/// as a script that ran and exited non-zero): the probe is no longer in flight, so the next
/// tick may send another instead of waiting for the lease the probe no longer holds.
pub fn on_neutral(d: &mut DestinationRow, probe: bool) {
    match d.state {
        BreakerState::HalfOpen if probe => d.probe_until = None,
        BreakerState::HalfOpen
        | BreakerState::Closed
        | BreakerState::Open
        | BreakerState::Paused => {}
    }
}

/// A transport failure of an attempt that started at `started_at`.
pub fn on_transport_failure(
    d: &mut DestinationRow,
    cfg: &Breaker,
    started_at: f64,
    probe: bool,
    now: f64,
    reason: &str,
) -> Effect {
    d.last_error = Some(reason.to_string());
    match d.state {
        BreakerState::Closed => {
            d.consecutive_failures += 1;
            if d.consecutive_failures >= cfg.trip_after {
                d.state = BreakerState::Open;
                d.opened_at = Some(now);
                d.cooldown_s = Some(cfg.cooldown_initial_s);
                d.probe_until = None;
                Effect::Tripped
            } else {
                Effect::None
            }
        }
        BreakerState::Open | BreakerState::HalfOpen => {
            // Attempts already in flight when the breaker opened record their outcome and
            // nothing else; only a probe re-trips and doubles the cooldown.
            let is_probe = probe || d.opened_at.is_some_and(|o| started_at > o);
            if !is_probe {
                return Effect::None;
            }
            d.consecutive_failures += 1;
            let next = super::retry::doubled(
                d.cooldown_s.unwrap_or(cfg.cooldown_initial_s),
                cfg.cooldown_max_s,
            );
            d.state = BreakerState::Open;
            d.opened_at = Some(now);
            d.cooldown_s = Some(next.max(cfg.cooldown_initial_s.min(cfg.cooldown_max_s)));
            d.probe_until = None;
            Effect::Retripped
        }
        // A paused destination keeps counting (its failures are real) but only resume
        // changes its state.
        BreakerState::Paused => {
            d.consecutive_failures += 1;
            Effect::None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> Breaker {
        Breaker {
            trip_after: 3,
            cooldown_initial_s: 30.0,
            cooldown_max_s: 600.0,
        }
    }

    #[test]
    fn trips_after_three_consecutive_transport_failures_and_doubles_to_the_cap() {
        let mut d = DestinationRow::closed("x");
        assert_eq!(
            on_transport_failure(&mut d, &cfg(), 0.0, false, 1.0, "refused"),
            Effect::None
        );
        assert_eq!(
            on_transport_failure(&mut d, &cfg(), 0.0, false, 2.0, "refused"),
            Effect::None
        );
        assert_eq!(
            on_transport_failure(&mut d, &cfg(), 0.0, false, 3.0, "refused"),
            Effect::Tripped
        );
        assert_eq!((d.state, d.cooldown_s), (BreakerState::Open, Some(30.0)));
        assert_eq!(gate(&mut d, 32.9), Gate::Closed);
        // An attempt that was in flight when it opened does nothing.
        assert_eq!(
            on_transport_failure(&mut d, &cfg(), 2.5, false, 4.0, "refused"),
            Effect::None
        );
        assert_eq!(d.cooldown_s, Some(30.0));
        let mut t = 33.0;
        let mut cooldowns = vec![];
        for _ in 0..7 {
            assert_eq!(gate(&mut d, t), Gate::Probe);
            assert_eq!(d.state, BreakerState::HalfOpen);
            assert_eq!(
                on_transport_failure(&mut d, &cfg(), t, true, t + 1.0, "refused"),
                Effect::Retripped
            );
            cooldowns.push(d.cooldown_s.unwrap());
            t = d.opened_at.unwrap() + d.cooldown_s.unwrap();
        }
        assert_eq!(
            cooldowns,
            vec![60.0, 120.0, 240.0, 480.0, 600.0, 600.0, 600.0]
        );
        assert_eq!(gate(&mut d, t), Gate::Probe);
        assert_eq!(on_success(&mut d, t + 1.0), Effect::Closed);
        assert_eq!(
            (d.state, d.consecutive_failures, d.cooldown_s),
            (BreakerState::Closed, 0, None)
        );
    }

    #[test]
    fn probe_until_blocks_a_second_probe_and_pause_is_sticky() {
        let mut d = DestinationRow::closed("x");
        d.state = BreakerState::HalfOpen;
        d.probe_until = Some(100.0);
        assert_eq!(gate(&mut d, 50.0), Gate::Closed);
        assert_eq!(gate(&mut d, 100.0), Gate::Probe);
        d.state = BreakerState::Paused;
        assert_eq!(gate(&mut d, 1e9), Gate::Closed);
        on_success(&mut d, 1.0);
        assert_eq!(d.state, BreakerState::Paused, "only resume leaves paused");
    }

    #[test]
    fn retry_after_is_a_soft_gate() {
        let mut d = DestinationRow::closed("x");
        d.retry_after_until = Some(10.0);
        assert_eq!(gate(&mut d, 9.0), Gate::Closed);
        assert_eq!(gate(&mut d, 10.0), Gate::Open);
        assert_eq!(d.state, BreakerState::Closed);
    }

    #[test]
    fn a_success_in_between_resets_the_run() {
        let mut d = DestinationRow::closed("x");
        on_transport_failure(&mut d, &cfg(), 0.0, false, 1.0, "e");
        on_transport_failure(&mut d, &cfg(), 0.0, false, 2.0, "e");
        on_success(&mut d, 3.0);
        on_transport_failure(&mut d, &cfg(), 0.0, false, 4.0, "e");
        assert_eq!(d.state, BreakerState::Closed);
    }
}
