"""One module per tab: each builds its tab's own components and wires its own events."""
