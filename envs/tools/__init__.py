"""Tool-use environments (math with a Python sandbox, SQL, search QA) and their protocol."""
