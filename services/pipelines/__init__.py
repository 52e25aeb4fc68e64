"""Batch pipelines: simulate a dataset, train and publish a model. They may use every shared
package; no service imports them."""
