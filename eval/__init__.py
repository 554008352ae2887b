"""Raw per-sample records -> figures, tables, files and plots. Never times or decodes."""
