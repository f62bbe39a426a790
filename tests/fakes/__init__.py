"""Protocol-faithful fake provider servers for the tests: real HTTP on loopback."""
