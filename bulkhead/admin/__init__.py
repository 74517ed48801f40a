"""`bulkhead admin`: the operator API's command-line client."""
