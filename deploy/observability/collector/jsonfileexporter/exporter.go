// Package jsonfileexporter is the collector exporter that appends every batch of spans it
// receives to a file, as one line of OTLP JSON per batch (the encoding of the OTLP/HTTP JSON
// protocol, so any OTLP tool reads it back).
//
// fraudmesh writes the traces its tail sampling keeps under the mesh's state folder with
// it; the contrib file exporter would do, but one of its modules cannot be had from the Go
// module proxy.
package jsonfileexporter

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/exporter"
	"go.opentelemetry.io/collector/exporter/exporterhelper"
	"go.opentelemetry.io/collector/pdata/ptrace"
)

// Config is the exporter's configuration: where the spans go.
type Config struct {
	// Path of the file spans are appended to; its folder is created if missing.
	Path string `mapstructure:"path"`
}

// Validate refuses a configuration without a path.
func (c *Config) Validate() error {
	if c.Path == "" {
		return errors.New("path must be set")
	}
	return nil
}

var typeName = component.MustNewType("jsonfile")

// NewFactory returns the factory the collector builds the exporter with.
func NewFactory() exporter.Factory {
	return exporter.NewFactory(
		typeName,
		func() component.Config { return &Config{} },
		exporter.WithTraces(createTraces, component.StabilityLevelDevelopment),
	)
}

func createTraces(ctx context.Context, set exporter.Settings, cfg component.Config) (exporter.Traces, error) {
	w := &writer{path: cfg.(*Config).Path}
	return exporterhelper.NewTraces(ctx, set, cfg, w.push,
		exporterhelper.WithStart(w.start),
		exporterhelper.WithShutdown(w.shutdown),
	)
}

type writer struct {
	path string
	mu   sync.Mutex
	file *os.File
	json ptrace.JSONMarshaler
}

func (w *writer) start(context.Context, component.Host) error {
	if err := os.MkdirAll(filepath.Dir(w.path), 0o755); err != nil {
		return fmt.Errorf("creating the folder of %s: %w", w.path, err)
	}
	file, err := os.OpenFile(w.path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return fmt.Errorf("opening %s: %w", w.path, err)
	}
	w.file = file
	return nil
}

func (w *writer) push(_ context.Context, traces ptrace.Traces) error {
	line, err := w.json.MarshalTraces(traces)
	if err != nil {
		return err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	// One write per line: a reader never sees half a batch unless the disk is full.
	_, err = w.file.Write(append(line, '\n'))
	return err
}

func (w *writer) shutdown(context.Context) error {
	if w.file == nil {
		return nil
	}
	return w.file.Close()
}
