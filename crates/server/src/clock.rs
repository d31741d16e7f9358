//! The controller's one clock read: every rule in pcmail-core takes the time as an argument.

/// The controller's clock, at the millisecond precision every store keeps, so that a value
/// answered now equals the same value read back later.
pub(crate) fn now() -> pcmail_core::Ts {
    chrono::SubsecRound::trunc_subsecs(chrono::Utc::now(), 3)
}
