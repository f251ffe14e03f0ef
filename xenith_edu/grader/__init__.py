"""The sandboxed grader: one learner's notebooks run in a sandbox, their functions called on
the assignment's hidden cases, the verdicts judged in the grader's own process as typed rows.

`judging.grade_learner` is the room's one door. What a submission is and which exercises the
teacher's notebooks check (roster.py, learners' names made canonical by names.py); notebooks
read under the sandbox's limits (nbread.py); the sandbox (sandbox.py, worker.py, cells as
IPython transforms them in cells.py, over the channel of wire.py, with the teacher's helpers of
material.py and without the exercise catalogue); the calls into what computes each answer
watched (delegation.py); the rows' statuses (statuses.py). The class, its journal and its
grades are the gradebook's (`xenith_edu.gradebook`). Nothing here is imported by the package's
face: the sandbox is Linux's.
"""
