//! Conclave's experiments. Each writes JSON lines (one object per measurement) and can draw SVG
//! plots; they measure, they never assert.

pub mod alloc;
pub mod gka;
pub mod keygraph;
pub mod plot;
