//! What a process asks for beyond the always-on core: each option is
//! compiled in, inert until configured, and reached from the core through
//! a few calls that return at once when it is off.
//!
//! - `traps`: trap entries (`RTPROF_TRAPS`), for functions too short for a
//!   jump, with the libc wrappers that keep SIGTRAP deliverable;
//! - `loops`: exact loop counts for the functions a user names
//!   (`RTPROF_LOOPS`): planning, probes, counts;
//! - `callers`: exact callers of every patched function (`RTPROF_CALLERS`);
//! - `events`: hardware and software event counts per function
//!   (`RTPROF_EVENTS`);
//! - `budget`: an overhead budget (`RTPROF_BUDGET`) that counts hot
//!   functions in bursts and estimates the rest;
//! - `counting_requests`: counting switched off and on per function, by
//!   name (`RTPROF_COUNT`, `RTPROF_NOCOUNT`, the C API, rtprofd's
//!   requests);
//! - `routes`: implementations the program offers for its functions
//!   (`rtprof_offer`, the `rtprof_offers` section), and calls routed to
//!   them on request (`rtprof route`);
//! - `attach`: the agent loaded into a running process (`rtprof attach`),
//!   and detached again.

pub mod attach;
pub mod budget;
pub mod callers;
pub mod counting_requests;
pub mod events;
pub mod loops;
pub mod routes;
pub mod traps;
