//! Protocol implementations. Each is sans-io: it turns bytes, the current time and an RNG into
//! validated values and decisions; the engine performs the effects.

pub mod agent_identity;
pub mod agent_mail;
pub mod asnet;
pub mod contact_link;
pub mod lan;
pub mod letagents;
pub mod letmeknow;
pub mod stringcup;
