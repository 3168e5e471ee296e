pub mod hitrate;
pub mod hitrate_sim;
