"""One module per tab: each `build(ctx)` lays out its components, wires their events to services, and returns them."""
