"""The Coding environment: SWE-smith tasks graded with swebench in helper sandboxes."""
