//! The seeds' flash experiments on the flash drive model (`stripelog sim
//! overprovisioning|lame-raid|wear`): see docs/experiments.md for what each shows.

pub mod arrays;
pub mod lame_raid;
pub mod overprovisioning;
pub mod wear;
