"""The RL loop on Lightning: `RLModule` and the phases it composes (collect, score, estimate, optimize, sync),
validation, reporting, asynchronous rounds, health and fault handling. Built on the core and the components."""
