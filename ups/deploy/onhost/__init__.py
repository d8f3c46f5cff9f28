"""A run on a host ups can reach over SSH: :mod:`plan` (the printable plan),
:mod:`operate` (code sync, preflight, start, stop), :mod:`runs` (which run, alive, its
outcome), :mod:`follow` (its log to the end), :mod:`fetch` (results home), :mod:`group`
(one job on several hosts)."""
