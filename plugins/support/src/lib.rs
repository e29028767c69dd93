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
