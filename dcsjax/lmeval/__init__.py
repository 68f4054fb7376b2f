"""lm-evaluation-harness: dcsjax as its model backend (`backend`) and dcsjax results in its schema (`export`)."""
