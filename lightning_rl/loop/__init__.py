"""The RL loop on Lightning: `RLModule` and the phases it composes (collect, forward, estimate, optimize, sync),
validation, reporting, asynchronous rounds and health. Built on the core, the components, the data, the run's state
(checkpoint format, strategies) and the callbacks (docs/layout.md)."""
