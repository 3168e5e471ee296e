//! Token sampling (to be written).
