//! Helpers shared by the bundled guest plugins.

/// Parses `params` into the fields of a settings struct: `set(name, value)`
/// must return `Ok(true)` when it knows `name`, `Ok(false)` when it does not.
pub fn apply(
    params: &[(String, String)],
    mut set: impl FnMut(&str, &str) -> Result<bool, String>,
) -> Result<(), String> {
    for (name, value) in params {
        if !set(name, value)? {
            return Err(format!("unknown parameter `{name}`"));
        }
    }
    Ok(())
}

/// Parses one value, naming the parameter on failure.
pub fn parse<T: std::str::FromStr>(name: &str, value: &str) -> Result<T, String> {
    value.trim().parse().map_err(|_| format!("parameter `{name}`: cannot parse `{value}`"))
}

/// A drafter's state that grows one token at a time.
pub trait Incremental {
    /// Forgets the context, keeping the parameters.
    fn clear(&mut self);
    /// Appends one token to the context.
    fn push(&mut self, token: i32);
    /// Up to `max` tokens to follow the context.
    fn draft(&self, max: usize) -> Vec<i32>;
}

/// Implements the drafter interface's `reset`, `observe` and `draft` inside
/// an `impl Guest` block, over a `thread_local!` `RefCell` holding an
/// [`Incremental`] state.
#[macro_export]
macro_rules! drafter_calls {
    ($state:ident) => {
        fn reset(context: Vec<i32>) {
            $state.with_borrow_mut(|s| {
                $crate::Incremental::clear(s);
                context.into_iter().for_each(|t| $crate::Incremental::push(s, t));
            });
        }

        fn observe(accepted: Vec<i32>) {
            $state.with_borrow_mut(|s| accepted.into_iter().for_each(|t| $crate::Incremental::push(s, t)));
        }

        fn draft(max: u32) -> Vec<i32> {
            $state.with_borrow(|s| $crate::Incremental::draft(s, max as usize))
        }
    };
}
