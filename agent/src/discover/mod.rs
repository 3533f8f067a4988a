//! What is there: the loaded modules (the loader's list), the process's
//! memory map, each module's file as mapped, and the functions it names.

pub mod fileimage;
pub mod maps;
pub mod modules;
pub mod symbols;
