"""The distributed lifecycle: read the env once, init, agree every step, tear down."""
