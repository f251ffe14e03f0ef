"""The exercise checks, one test module per chapter, and the engine they share."""
