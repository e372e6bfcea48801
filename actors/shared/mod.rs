//! What several stages share; a helper moves here from the stage that wrote it first once a second
//! stage needs it.

pub mod accounting;
pub mod answer;
pub mod evidence;
pub mod fanout;
pub mod selection;
pub mod span;
pub mod two_options;
