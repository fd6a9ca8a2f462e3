"""The demo's stages, one per module: each has ``run(...)`` returning the numbers the report needs and, where it
adds a report section, ``section(result) -> list[str]``."""
