"""Binary byte units, defined once for the emulator and the harness (1 KiB = 1024 bytes)."""

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30
