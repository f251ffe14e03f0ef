"""The ground floor: what every floor above may use and that knows nothing of the model.

`gradcheck` (central finite differences in float64), `workspace` (reused arrays for the fast
forms), `util` (atomic file writes, one-line messages), `plots` (the chapters' figure style),
`perf` (the allocator setting of long runs), `notebook` (a notebook file read, the
`notebooks` extra named when it is missing).
"""
