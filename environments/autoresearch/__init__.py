"""AutoResearch: research runs in helper sandboxes, scored by a private grader."""
